//! A linear layer then ReLU and inverted dropout as one kernel (fc1 of the
//! CNN): what [`crate::ops::LayerKernel::layer_relu_fwd`] and
//! `layer_relu_bwd` run for a linear layer on a GPU that fuses
//! ([`crate::ops::Conv2dPoolKernel::fuses`]). The ReLU and the dropout run
//! in the product's store (`linear_relu.cu`), or for a split K in the split
//! reduction's, so the layer's output is written once instead of written,
//! read and written again by a second kernel; the results are bit for bit
//! those of the layer then [`crate::ops::ReluKernel`] with the same
//! dropout, which every other device runs. Backward masks `dy` and sums
//! the bias gradient in one pass (`linear_relu_bwd_bias_f32`), then runs
//! the layer's two products on the masked `dy`: the bits of
//! [`crate::ops::ReluKernel::relu_bwd`] then
//! [`crate::ops::LayerKernel::layer_bwd`].

pub(super) mod cuda;
#[cfg(test)]
mod tests;
