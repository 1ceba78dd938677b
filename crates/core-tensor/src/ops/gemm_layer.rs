//! The CUDA side of the layers with a weight and a bias (conv2d, linear):
//! three GEMMs and a bias reduction, the same steps for both, so
//! [`LayerKernel`] is implemented once here, for every [`GemmLayer`], and
//! each op only says its kernels and shapes.

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};

use super::{Conv2dPoolKernel, Dropout, LayerKernel, LayerLens, ParamAt, ReluKernel};
use crate::backend::cuda::gemm::{BiasGemmKernels, GemmKernels, GemmPlan, Store, check_i32};
use crate::backend::cuda::{view, view_mut};
use crate::{Cuda, Result};

/// `(M, N, K)` of one product.
pub(crate) type Shape = (usize, usize, usize);

/// A layer computed as GEMMs on the GPU: `y = x·W + b`, `dW` from `x` and
/// `dy`, `dx` from `dy` and `W`.
pub(crate) trait GemmLayer: Copy + 'static {
    /// The forward kernels (with the bias), then the weight and input
    /// gradients' (without).
    const FWD: BiasGemmKernels<Self>;
    const BWD_WEIGHT: GemmKernels<Self>;
    const BWD_INPUT: GemmKernels<Self>;

    /// The buffer lengths of a call (an error for an invalid geometry).
    fn lens(&self) -> Result<LayerLens>;
    /// The products' shapes: forward, weight gradient, input gradient.
    fn shapes(&self) -> [Shape; 3];

    /// Queues `db = Σ dy` over the batch (and pixels).
    ///
    /// # Safety
    ///
    /// `dy` and `db` have the lengths [`Self::lens`] gives.
    unsafe fn bias_grad(
        &self,
        cuda: &Cuda,
        dy: &CudaSlice<f32>,
        db: &mut CudaViewMut<'_, f32>,
    ) -> Result<()>;

    /// The forward pass with ReLU and `dropout` in one kernel, where the
    /// layer has one for `dropout`; `None` where it has not (the layer and
    /// `relu_fwd` run instead).
    fn fused_relu_fwd(
        &self,
        _cuda: &Cuda,
        _dropout: Dropout,
        _x: &CudaSlice<f32>,
        _params: &CudaSlice<f32>,
        _at: &ParamAt,
        _y: &mut CudaSlice<f32>,
    ) -> Option<Result<()>> {
        None
    }

    /// The backward pass of [`Self::fused_relu_fwd`] in fewer passes, where the
    /// layer has them; `None` where it has not (`relu_bwd` and the layer's
    /// backward run instead).
    #[allow(clippy::too_many_arguments)]
    fn fused_relu_bwd(
        &self,
        _cuda: &Cuda,
        _dropout: Dropout,
        _x: &CudaSlice<f32>,
        _params: &CudaSlice<f32>,
        _at: &ParamAt,
        _saved: (&CudaSlice<f32>, &mut CudaSlice<f32>),
        _grads: &mut CudaSlice<f32>,
        _dx: Option<&mut CudaSlice<f32>>,
    ) -> Option<Result<()>> {
        None
    }
}

impl<L: GemmLayer> LayerKernel<L> for Cuda {
    fn layer_fwd(
        &self,
        g: &L,
        x: &CudaSlice<f32>,
        params: &CudaSlice<f32>,
        at: &ParamAt,
        y: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let Some(ForwardPlan { plan, w, b }) = self.plan_forward(None, g, x, params, at, y)? else {
            return Ok(());
        };
        // SAFETY: every buffer's length was checked against the geometry
        // (`plan_forward`), and the plan is the geometry's forward product.
        unsafe { self.gemm(&plan, *g, x, &w, Store::Bias(&L::FWD, &b), y) }
    }

    fn layer_bwd(
        &self,
        g: &L,
        x: &CudaSlice<f32>,
        params: &CudaSlice<f32>,
        at: &ParamAt,
        dy: &CudaSlice<f32>,
        grads: &mut CudaSlice<f32>,
        dx: Option<&mut CudaSlice<f32>>,
    ) -> Result<()> {
        let lens = check_bwd(g, x, params, at, dy, grads, dx.as_deref())?;
        if lens.bias > 0 {
            let mut db = view_mut(lens.op, grads, at.bias.clone())?;
            // SAFETY: `dy` and `db` were checked by `check_bwd`.
            unsafe { g.bias_grad(self, dy, &mut db)? };
        }
        self.layer_bwd_products(g, x, params, at, dy, grads, dx)
    }

    fn layer_relu_fwd(
        &self,
        g: &L,
        dropout: Dropout,
        x: &CudaSlice<f32>,
        params: &CudaSlice<f32>,
        at: &ParamAt,
        y: &mut CudaSlice<f32>,
    ) -> Result<()> {
        if self.fuses()
            && let Some(fused) = g.fused_relu_fwd(self, dropout, x, params, at, y)
        {
            return fused;
        }
        self.layer_fwd(g, x, params, at, y)?;
        self.relu_fwd(dropout, y)
    }

    fn layer_relu_bwd(
        &self,
        g: &L,
        dropout: Dropout,
        x: &CudaSlice<f32>,
        params: &CudaSlice<f32>,
        at: &ParamAt,
        (y, dy): (&CudaSlice<f32>, &mut CudaSlice<f32>),
        grads: &mut CudaSlice<f32>,
        mut dx: Option<&mut CudaSlice<f32>>,
    ) -> Result<()> {
        if self.fuses()
            && let Some(fused) = g.fused_relu_bwd(
                self,
                dropout,
                x,
                params,
                at,
                (y, &mut *dy),
                grads,
                dx.as_deref_mut(),
            )
        {
            return fused;
        }
        self.relu_bwd(dropout, y, dy)?;
        self.layer_bwd(g, x, params, at, dy, grads, dx)
    }
}

/// A forward pass's product planned, its buffers checked against the
/// geometry: the plan and the weight and bias it reads from `params`.
pub(crate) struct ForwardPlan<'p> {
    pub plan: GemmPlan,
    pub w: CudaView<'p, f32>,
    pub b: CudaView<'p, f32>,
}

impl Cuda {
    /// What every forward pass of a GEMM layer does first, fused or not:
    /// checks the buffers against `g` and the kernels' 32-bit indices, and
    /// plans the forward product; `None` for an empty output (nothing to
    /// compute). `op` names the call in errors (`None`: the layer's name).
    pub(crate) fn plan_forward<'p, L: GemmLayer>(
        &self,
        op: Option<&'static str>,
        g: &L,
        x: &CudaSlice<f32>,
        params: &'p CudaSlice<f32>,
        at: &ParamAt,
        y: &CudaSlice<f32>,
    ) -> Result<Option<ForwardPlan<'p>>> {
        let lens = g.lens()?;
        lens.check::<Self>(x, params, at, y)?;
        let op = op.unwrap_or(lens.op);
        check_i32(op, &[x.len(), y.len(), lens.weight])?;
        if y.is_empty() {
            return Ok(None);
        }
        let [(m, n, k), _, _] = g.shapes();
        let plan = GemmPlan::new(op, m, n, k, self.gemm_tile())?;
        let w = view(op, params, at.weight.clone())?;
        let b = view(op, params, at.bias.clone())?;
        Ok(Some(ForwardPlan { plan, w, b }))
    }

    /// The backward pass's products, `dW` and `dx` (when asked for), for an
    /// op that writes `db` itself; `check_bwd` checks their buffers.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn layer_bwd_products<L: GemmLayer>(
        &self,
        g: &L,
        x: &CudaSlice<f32>,
        params: &CudaSlice<f32>,
        at: &ParamAt,
        dy: &CudaSlice<f32>,
        grads: &mut CudaSlice<f32>,
        dx: Option<&mut CudaSlice<f32>>,
    ) -> Result<()> {
        let lens = check_bwd(g, x, params, at, dy, grads, dx.as_deref())?;
        let [_, (wm, wn, wk), (im, in_, ik)] = g.shapes();
        if lens.weight > 0 {
            let plan = GemmPlan::new(lens.op, wm, wn, wk, self.gemm_tile())?;
            let mut dw = view_mut(lens.op, grads, at.weight.clone())?;
            let store = Store::Plain(&L::BWD_WEIGHT);
            // SAFETY: `x`, `dy` and `grads` (hence `dw`) were checked
            // against the geometry by `check_bwd`; the plan is its
            // weight-gradient product.
            unsafe { self.gemm(&plan, *g, x, dy, store, &mut dw)? };
        }
        match dx {
            Some(dx) if !dx.is_empty() => {
                let w = view(lens.op, params, at.weight.clone())?;
                let plan = GemmPlan::new(lens.op, im, in_, ik, self.gemm_tile())?;
                let store = Store::Plain(&L::BWD_INPUT);
                // SAFETY: `dy`, `params` (hence `w`) and `dx` were checked
                // by `check_bwd`; the plan is the input-gradient product.
                unsafe { self.gemm(&plan, *g, dy, &w, store, dx) }
            }
            _ => Ok(()),
        }
    }
}

/// Checks the backward pass's buffers against `g`, and that the kernels'
/// 32-bit indices reach them; returns the lengths.
pub(crate) fn check_bwd<L: GemmLayer>(
    g: &L,
    x: &CudaSlice<f32>,
    params: &CudaSlice<f32>,
    at: &ParamAt,
    dy: &CudaSlice<f32>,
    grads: &CudaSlice<f32>,
    dx: Option<&CudaSlice<f32>>,
) -> Result<LayerLens> {
    let lens = g.lens()?;
    lens.check_bwd::<Cuda>(x, params, at, dy, grads, dx)?;
    check_i32(lens.op, &[x.len(), dy.len(), lens.weight])?;
    Ok(lens)
}
