//! The kinds every GEMM kernel comes in, one line each: the host's mirror
//! of `GEMM_VARIANTS` in sgemm.cuh, which stamps one entry point per kind
//! (`<family>_<suffix>`) from each family's one body. From this list
//! `kernel_table!` (launch.rs) writes each family's kernel names and its one
//! typed launcher, which takes a [`GemmVariant`]; [`GemmVariant::of`] picks
//! it for a backend's products (`GemmPlan::variant`, gemm.rs, says whether
//! a product runs in the wide tiles).

use crate::{GemmStaging, Products};

/// Calls `$then!($($args)* square: …; wide: …;)` with the variants, as
/// `Name "suffix"`, in sgemm.cuh's order: the square tiles' kinds (every
/// family has them), then the wide tiles' (`GEMM_VARIANTS` families only).
/// A precision, tile or staging is added here, in sgemm.cuh's list, in
/// [`GemmVariant::of`] and in the device code that multiplies it
/// (docs/internals.md, "Adding a precision").
macro_rules! gemm_variants {
    ($($then:tt)::+!($($args:tt)*)) => {
        $($then)::+! {
            $($args)*
            square: F32 "f32", F32Cp "f32_cp", Tf32 "tf32", Tf32Cp "tf32_cp", Bf16 "bf16";
            wide: F32Wide "f32w", F32WideCp "f32w_cp", Tf32Wide "tf32w", Tf32WideCp "tf32w_cp";
        }
    };
}
pub(crate) use gemm_variants;

/// Defines [`GemmVariant`] from the list.
macro_rules! define_variants {
    (square: $($sq:ident $sqs:literal),*; wide: $($w:ident $ws:literal),*;) => {
        /// One entry point of a GEMM family: its precision, its tiles and
        /// its staging, fixed when the kernel was compiled.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub(crate) enum GemmVariant {
            $($sq,)*
            $($w,)*
        }

        impl GemmVariant {
            /// Every variant, in sgemm.cuh's order.
            #[cfg(test)]
            pub(crate) const ALL: &[Self] = &[$(Self::$sq,)* $(Self::$w,)*];

            /// The suffix of its entry points' names (`linear_fwd_<suffix>`).
            pub(crate) fn suffix(self) -> &'static str {
                match self {
                    $(Self::$sq => $sqs,)*
                    $(Self::$w => $ws,)*
                }
            }
        }
    };
}
gemm_variants!(define_variants!());

impl GemmVariant {
    /// The entry point that runs `products`, in the wide tiles when `wide`
    /// (a plan the host cut into them): a wide one only then, so that no
    /// other product runs with their registers. The one place a kind is
    /// chosen.
    pub(crate) fn of(products: Products, wide: bool) -> Self {
        // Each precision's kinds: square and wide tiles, register and
        // cp.async staging.
        let (kinds, staging) = match products {
            // bf16 has the square tiles only: its plans are never wide.
            Products::Bf16 => return Self::Bf16,
            Products::F32 { staging, .. } => (
                [[Self::F32, Self::F32Cp], [Self::F32Wide, Self::F32WideCp]],
                staging,
            ),
            Products::Tf32 { staging, .. } => (
                [
                    [Self::Tf32, Self::Tf32Cp],
                    [Self::Tf32Wide, Self::Tf32WideCp],
                ],
                staging,
            ),
        };
        kinds[usize::from(wide)][usize::from(staging == GemmStaging::CpAsync)]
    }
}

/// The name of `$family`'s entry point for `$variant`, `None` where the
/// family has none (a `GEMM_SQUARE_VARIANTS` family in the wide tiles).
macro_rules! family_kernel_name {
    (
        $variant:ident GEMM_VARIANTS $family:ident
        square: $($sq:ident $sqs:literal),*; wide: $($w:ident $ws:literal),*;
    ) => {
        match $variant {
            $($crate::backend::cuda::variants::GemmVariant::$sq => {
                Some(concat!(stringify!($family), "_", $sqs))
            })*
            $($crate::backend::cuda::variants::GemmVariant::$w => {
                Some(concat!(stringify!($family), "_", $ws))
            })*
        }
    };
    (
        $variant:ident GEMM_SQUARE_VARIANTS $family:ident
        square: $($sq:ident $sqs:literal),*; wide: $($w:ident $ws:literal),*;
    ) => {
        match $variant {
            $($crate::backend::cuda::variants::GemmVariant::$sq => {
                Some(concat!(stringify!($family), "_", $sqs))
            })*
            $($crate::backend::cuda::variants::GemmVariant::$w => None,)*
        }
    };
}
pub(crate) use family_kernel_name;

/// A module's function names: `[$done,*]` then, for each
/// `GEMM_VARIANTS family` or `GEMM_SQUARE_VARIANTS family` left, its
/// entry points' names.
macro_rules! module_functions {
    ([$($done:expr,)*]) => {
        &[$($done,)*]
    };
    ([$($done:expr,)*] $list:ident $family:ident $($rest:ident)*) => {
        $crate::backend::cuda::variants::gemm_variants!(
            $crate::backend::cuda::variants::module_functions_of!(
                [$($done,)*] $list $family; $($rest)*;
            )
        )
    };
}
pub(crate) use module_functions;

/// [`module_functions!`]'s step: one family's names, given the list.
macro_rules! module_functions_of {
    (
        [$($done:expr,)*] GEMM_VARIANTS $family:ident; $($rest:ident)*;
        square: $($sq:ident $sqs:literal),*; wide: $($w:ident $ws:literal),*;
    ) => {
        $crate::backend::cuda::variants::module_functions!(
            [
                $($done,)*
                $(concat!(stringify!($family), "_", $sqs),)*
                $(concat!(stringify!($family), "_", $ws),)*
            ]
            $($rest)*
        )
    };
    (
        [$($done:expr,)*] GEMM_SQUARE_VARIANTS $family:ident; $($rest:ident)*;
        square: $($sq:ident $sqs:literal),*; wide: $($w:ident $ws:literal),*;
    ) => {
        $crate::backend::cuda::variants::module_functions!(
            [$($done,)* $(concat!(stringify!($family), "_", $sqs),)*]
            $($rest)*
        )
    };
}
pub(crate) use module_functions_of;
