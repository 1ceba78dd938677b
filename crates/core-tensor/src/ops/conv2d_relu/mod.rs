//! conv2d then ReLU as one kernel: on a GPU the ReLU runs in the product's
//! store (`conv2d_relu.cu`), so the convolution's output is written once
//! instead of written, read and written again by a second kernel. It is
//! what [`crate::ops::LayerKernel::layer_relu_fwd`] runs for a convolution
//! on a GPU that fuses, with no dropout (the kernel has none), and its
//! results are bit for bit those of the layer then
//! [`crate::ops::ReluKernel`], which every other device runs. Backward is
//! ReLU's and the convolution's own kernels.

pub(super) mod cuda;
