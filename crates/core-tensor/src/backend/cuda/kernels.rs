//! The registry of kernel modules: one per `src/ops/<op>/<op>.cu`, with the
//! entry points its `cuda.rs` launches. [`super::Cuda::new`] loads every one,
//! so a name missing from a module fails there, not mid-training; the NVRTC
//! test checks each name against the compiled PTX.

mod ptx {
    include!(concat!(env!("OUT_DIR"), "/ptx.rs"));
}

/// The virtual architecture of the PTX embedded by build.rs, if nvcc ran.
pub(super) const PTX_ARCH: Option<&str> = ptx::PTX_ARCH;

/// One `.cu` file, compiled as a unit.
#[derive(Debug)]
pub struct KernelModule {
    /// The op, e.g. `conv2d`.
    pub name: &'static str,
    /// The CUDA C++ source, its `#include`s pasted in by build.rs.
    pub source: &'static str,
    /// PTX that nvcc built from `source` at build time, if it was found.
    pub ptx: Option<&'static str>,
    /// The `extern "C"` kernels the op launches.
    pub functions: &'static [&'static str],
}

static MODULES: [KernelModule; 10] = [
    KernelModule {
        name: "accuracy",
        source: ptx::ACCURACY_SRC,
        ptx: ptx::ACCURACY_PTX,
        functions: &["count_correct_f32"],
    },
    KernelModule {
        name: "adam",
        source: ptx::ADAM_SRC,
        ptx: ptx::ADAM_PTX,
        functions: &["adam_step_f32"],
    },
    KernelModule {
        name: "conv2d",
        source: ptx::CONV2D_SRC,
        ptx: ptx::CONV2D_PTX,
        functions: &[
            "conv2d_fwd_f32",
            "conv2d_fwd_partial_f32",
            "conv2d_fwd_reduce_f32",
            "conv2d_bwd_input_f32",
            "conv2d_bwd_input_partial_f32",
            "conv2d_bwd_input_reduce_f32",
            "conv2d_bwd_weight_f32",
            "conv2d_bwd_weight_partial_f32",
            "conv2d_bwd_weight_reduce_f32",
            "conv2d_bwd_bias_f32",
        ],
    },
    KernelModule {
        name: "cross_entropy",
        source: ptx::CROSS_ENTROPY_SRC,
        ptx: ptx::CROSS_ENTROPY_PTX,
        functions: &["cross_entropy_fwd_bwd_f32"],
    },
    KernelModule {
        name: "dropout",
        source: ptx::DROPOUT_SRC,
        ptx: ptx::DROPOUT_PTX,
        functions: &["dropout_fwd_f32", "dropout_bwd_f32"],
    },
    KernelModule {
        name: "finite",
        source: ptx::FINITE_SRC,
        ptx: ptx::FINITE_PTX,
        functions: &["guard_finite_f32"],
    },
    KernelModule {
        name: "gather",
        source: ptx::GATHER_SRC,
        ptx: ptx::GATHER_PTX,
        functions: &["gather_batch_u8_f32"],
    },
    KernelModule {
        name: "linear",
        source: ptx::LINEAR_SRC,
        ptx: ptx::LINEAR_PTX,
        functions: &[
            "linear_fwd_f32",
            "linear_fwd_partial_f32",
            "linear_fwd_reduce_f32",
            "linear_bwd_weight_f32",
            "linear_bwd_weight_partial_f32",
            "linear_bwd_weight_reduce_f32",
            "linear_bwd_input_f32",
            "linear_bwd_input_partial_f32",
            "linear_bwd_input_reduce_f32",
            "linear_bwd_bias_f32",
        ],
    },
    KernelModule {
        name: "maxpool2d",
        source: ptx::MAXPOOL2D_SRC,
        ptx: ptx::MAXPOOL2D_PTX,
        functions: &["maxpool2d_fwd_f32", "maxpool2d_bwd_f32"],
    },
    KernelModule {
        name: "relu",
        source: ptx::RELU_SRC,
        ptx: ptx::RELU_PTX,
        functions: &["relu_fwd_f32", "relu_bwd_f32"],
    },
];

/// Every kernel module, in name order.
pub fn kernel_modules() -> &'static [KernelModule] {
    &MODULES
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_kernel_is_defined_in_its_source() {
        for module in kernel_modules() {
            for f in module.functions {
                let definition = format!(" {f}(");
                assert!(
                    module.source.contains(&definition),
                    "{}: no `{f}(` in the source",
                    module.name
                );
            }
        }
    }

    #[test]
    fn every_kernel_name_is_unique() {
        let mut names: Vec<_> = kernel_modules().iter().flat_map(|m| m.functions).collect();
        let total = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), total);
    }
}
