//! The kinds every GEMM kernel comes in, one line each: the host's mirror
//! of `GEMM_VARIANTS` in sgemm.cuh, which stamps one entry point per kind
//! (`<family>_<suffix>`) from each family's one body. From this list
//! `kernel_table!` (launch.rs) writes each family's kernel names and its one
//! typed launcher, which takes a [`GemmVariant`]; [`GemmVariant::of`] picks
//! it for a backend's products by what each line says it runs
//! (`GemmPlan::variant`, gemm.rs, says whether a product runs in the wide
//! tiles). Tools that read the compiled kernels (nvrtc_compile's register
//! table) name them by the same list.

use crate::{Fp32Tile, GemmStaging, MatmulPrecision, Products};

/// Calls `$then!($($args)* square: …; wide: …;)` with the variants, as
/// `Name "suffix" (Precision Staging)`, in sgemm.cuh's order: the square
/// tiles' kinds (every family has them), then the wide tiles' (`GEMM_VARIANTS`
/// families only). A precision, tile or staging is added here, in
/// sgemm.cuh's list and in the device code that multiplies it
/// (docs/internals.md, "Adding a precision").
macro_rules! gemm_variants {
    ($($then:tt)::+!($($args:tt)*)) => {
        $($then)::+! {
            $($args)*
            square:
                F32 "f32" (Fp32 Registers),
                F32Cp "f32_cp" (Fp32 CpAsync),
                Tf32 "tf32" (Tf32 Registers),
                Tf32Cp "tf32_cp" (Tf32 CpAsync),
                Bf16 "bf16" (Bf16 Registers);
            wide:
                F32Wide "f32w" (Fp32 Registers),
                F32WideCp "f32w_cp" (Fp32 CpAsync),
                Tf32Wide "tf32w" (Tf32 Registers),
                Tf32WideCp "tf32w_cp" (Tf32 CpAsync);
        }
    };
}
pub(crate) use gemm_variants;

/// Defines [`GemmVariant`] from the list.
macro_rules! define_variants {
    (
        square: $($sq:ident $sqs:literal ($sqp:ident $sqst:ident)),*;
        wide: $($w:ident $ws:literal ($wp:ident $wst:ident)),*;
    ) => {
        /// One entry point of a GEMM family: its precision, its tiles and
        /// its staging, fixed when the kernel was compiled.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum GemmVariant {
            $($sq,)*
            $($w,)*
        }

        impl GemmVariant {
            /// Every variant, in sgemm.cuh's order.
            pub const ALL: &[Self] = &[$(Self::$sq,)* $(Self::$w,)*];

            /// The suffix of its entry points' names (`linear_fwd_<suffix>`).
            pub fn suffix(self) -> &'static str {
                match self {
                    $(Self::$sq => $sqs,)*
                    $(Self::$w => $ws,)*
                }
            }

            /// What its entry points run: their precision, tiles and
            /// staging.
            pub fn runs(self) -> (MatmulPrecision, Fp32Tile, GemmStaging) {
                match self {
                    $(Self::$sq => (MatmulPrecision::$sqp, Fp32Tile::Square, GemmStaging::$sqst),)*
                    $(Self::$w => (MatmulPrecision::$wp, Fp32Tile::Wide, GemmStaging::$wst),)*
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
    /// chosen: the line of the list that runs them.
    pub(crate) fn of(products: Products, wide: bool) -> Self {
        let (precision, staging) = (products.precision(), products.staging());
        let find =
            |tile| (Self::ALL.iter().copied()).find(|v| v.runs() == (precision, tile, staging));
        // bf16 has the square tiles only: its plans are never wide.
        let wide = wide.then(|| find(Fp32Tile::Wide)).flatten();
        wide.or_else(|| find(Fp32Tile::Square))
            .expect("the list has a square kind of every product (`every_products_has_its_kinds`)")
    }
}

/// The name of `$family`'s entry point for `$variant`, `None` where the
/// family has none (a `GEMM_SQUARE_VARIANTS` family in the wide tiles).
macro_rules! family_kernel_name {
    (
        $variant:ident GEMM_VARIANTS $family:ident
        square: $($sq:ident $sqs:literal $sqr:tt),*; wide: $($w:ident $ws:literal $wr:tt),*;
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
        square: $($sq:ident $sqs:literal $sqr:tt),*; wide: $($w:ident $ws:literal $wr:tt),*;
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
        square: $($sq:ident $sqs:literal $sqr:tt),*; wide: $($w:ident $ws:literal $wr:tt),*;
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
        square: $($sq:ident $sqs:literal $sqr:tt),*; wide: $($w:ident $ws:literal $wr:tt),*;
    ) => {
        $crate::backend::cuda::variants::module_functions!(
            [$($done,)* $(concat!(stringify!($family), "_", $sqs),)*]
            $($rest)*
        )
    };
}
pub(crate) use module_functions_of;

#[cfg(test)]
mod tests {
    use super::*;

    /// Every products the type lets one write runs on a kind of the list,
    /// in the square tiles and (but bf16) in the wide ones, with their
    /// precision and staging.
    #[test]
    fn every_products_has_its_kinds() {
        let precisions = [
            MatmulPrecision::Fp32,
            MatmulPrecision::Tf32,
            MatmulPrecision::Bf16,
        ];
        let tiles = [Fp32Tile::Square, Fp32Tile::Wide];
        let stagings = [GemmStaging::Registers, GemmStaging::CpAsync];
        let mut used = Vec::new();
        for p in precisions {
            for tile in tiles {
                for staging in stagings {
                    let Ok(products) = Products::new(p, tile, staging) else {
                        continue;
                    };
                    for wide in [false, true] {
                        let v = GemmVariant::of(products, wide);
                        let runs_wide = wide && p != MatmulPrecision::Bf16;
                        let want = if runs_wide {
                            Fp32Tile::Wide
                        } else {
                            Fp32Tile::Square
                        };
                        assert_eq!(v.runs(), (p, want, staging), "{products:?}, wide {wide}");
                        used.push(v);
                    }
                }
            }
        }
        for v in GemmVariant::ALL {
            assert!(used.contains(v), "no products runs {v:?}");
        }
    }
}
