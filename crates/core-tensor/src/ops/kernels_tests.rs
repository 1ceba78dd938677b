use super::{SIGNATURES, kernel_modules};
use crate::backend::cuda::kernels::c_types;
use crate::backend::cuda::variants::GemmVariant;
use crate::ops::conv2d::Conv2dLaunch;
use crate::ops::dropout::cuda::DropoutArgs;
use crate::ops::gather::cuda::GatherArgs;
use crate::ops::linear::LinearLaunch;
use crate::ops::{
    AdamScalars, ClassGeom, Conv2dGeom, EmbeddingGeom, LinearGeom, MseGeom, OffsetGeom, PoolGeom,
    RowsGeom, SparseAdamScalars,
};

// How the ops' parameter types are spelled in C (the scalars' in
// backend/cuda/kernels.rs).
c_types! {
    AdamScalars => "AdamScalars",
    ClassGeom => "ClassGeom",
    Conv2dGeom => "Conv2dGeom",
    Conv2dLaunch => "Conv2dLaunch",
    DropoutArgs => "DropoutArgs",
    EmbeddingGeom => "EmbeddingGeom",
    GatherArgs => "GatherArgs",
    LinearGeom => "LinearGeom",
    LinearLaunch => "LinearLaunch",
    MseGeom => "MseGeom",
    OffsetGeom => "OffsetGeom",
    PoolGeom => "PoolGeom",
    RowsGeom => "RowsGeom",
    SparseAdamScalars => "SparseAdamScalars",
}

/// The parameter types of `kernel`'s definition in `source`, one
/// space between words and none before a `*`.
fn c_parameter_types(source: &str, kernel: &str) -> Vec<String> {
    let start = source
        .find(&format!(" {kernel}("))
        .unwrap_or_else(|| panic!("no `{kernel}(` in its source"))
        + kernel.len()
        + 2;
    let end = start + source[start..].find(')').expect("a closing parenthesis");
    source[start..end]
        .split(',')
        .map(|param| {
            let words: Vec<&str> = param.split_whitespace().collect();
            // The last word is the parameter's name (`float* x`).
            let ty = words[..words.len() - 1].join(" ");
            let ty = ty.replace(" *", "*");
            if words[words.len() - 1].starts_with('*') {
                format!("{ty}*")
            } else {
                ty
            }
        })
        .collect()
}

/// The parameter types of the entry points a GEMM family's STAMP macro
/// writes: `{list}({family}, STAMP)` in `source` names the macro, whose
/// `#define STAMP(NAME, KIND)` spells the signature of `NAME`.
fn family_parameter_types(source: &str, list: &str, family: &str) -> Vec<String> {
    let stamped = format!("\n{list}({family}, ");
    let at = source
        .find(&stamped)
        .unwrap_or_else(|| panic!("no `{}` in its source", stamped.trim()))
        + stamped.len();
    let stamp = &source[at..at + source[at..].find(')').expect("a closing parenthesis")];
    let define = format!("#define {stamp}(NAME, KIND)");
    let body = &source[source
        .find(&define)
        .unwrap_or_else(|| panic!("no `{define}` in the source of `{family}`"))..];
    c_parameter_types(&body.replace('\\', " "), "NAME")
}

/// The suffixes a list of sgemm.cuh stamps, in order: `NAME##_<suffix>`
/// in its `#define` (and in the lists it includes).
fn c_list(list: &str) -> Vec<String> {
    let sgemm = include_str!("../backend/cuda/sgemm.cuh");
    let define = format!("#define {list}(NAME, STAMP)");
    let start = sgemm.find(&define).expect("the list's definition");
    let mut suffixes = Vec::new();
    for line in sgemm[start..].lines().skip(1) {
        let entry = line.trim().trim_end_matches('\\').trim();
        if let Some(rest) = entry.split("NAME##_").nth(1) {
            suffixes.push(rest.split(',').next().unwrap_or_default().to_owned());
        } else if let Some(included) = entry.strip_suffix("(NAME, STAMP)") {
            suffixes.extend(c_list(included));
        }
        if !line.trim_end().ends_with('\\') {
            break;
        }
    }
    suffixes
}

/// The host's list of variants is sgemm.cuh's, in its order: the
/// square tiles' kinds, then the wide tiles'.
#[test]
fn the_variants_are_sgemm_cuh_s() {
    let host: Vec<&str> = GemmVariant::ALL.iter().map(|v| v.suffix()).collect();
    assert_eq!(c_list("GEMM_VARIANTS"), host);
    let square = c_list("GEMM_SQUARE_VARIANTS");
    assert_eq!(square, host[..square.len()]);
    assert!(
        square.len() < host.len(),
        "the wide kinds follow the square ones"
    );
}

/// A family's entry points: every variant its list stamps.
fn family_kernels(list: &str, family: &str) -> Vec<String> {
    c_list(list)
        .into_iter()
        .map(|suffix| format!("{family}_{suffix}"))
        .collect()
}

/// The launchers push what the kernels take: each declaration in the
/// table spells the C signature of its kernel, type for type, and each
/// family's that of its STAMP macro.
#[test]
fn every_declared_signature_matches_its_source() {
    let declared = |params: &[(&str, &str)]| -> Vec<String> {
        params
            .iter()
            .map(|&(kind, c)| match kind {
                "In" => format!("const {c}*"),
                "Out" => format!("{c}*"),
                _ => c.to_owned(),
            })
            .collect()
    };
    let module_of = |kernel: &str| {
        kernel_modules()
            .iter()
            .find(|m| m.functions.contains(&kernel))
            .expect("every declared kernel is in a module")
    };
    let mut checked = 0;
    for (kernel, params) in SIGNATURES.iter().flat_map(|(kernels, _)| kernels.iter()) {
        let module = module_of(kernel);
        assert_eq!(
            declared(params),
            c_parameter_types(module.source, kernel),
            "{kernel}: the table's declaration differs from {}.cu",
            module.name
        );
        checked += 1;
    }
    for (list, family, params) in SIGNATURES.iter().flat_map(|(_, families)| families.iter()) {
        let kernels = family_kernels(list, family);
        let module = module_of(&kernels[0]);
        assert_eq!(
            declared(params),
            family_parameter_types(module.source, list, family),
            "{family}: the table's declaration differs from {}.cu",
            module.name
        );
        checked += kernels.len();
    }
    let listed: usize = kernel_modules().iter().map(|m| m.functions.len()).sum();
    assert_eq!(checked, listed);
}

/// Each listed kernel is written in its source: by name, or stamped
/// by its family's list, which names the same kinds as the host's.
#[test]
fn every_listed_kernel_is_defined_in_its_source() {
    for module in kernel_modules() {
        let mut stamped = Vec::new();
        for (list, family, _) in SIGNATURES.iter().flat_map(|(_, families)| families.iter()) {
            let kernels = family_kernels(list, family);
            if module.functions.contains(&kernels[0].as_str()) {
                let line = format!("\n{list}({family}, ");
                assert!(
                    module.source.contains(&line),
                    "{}: no `{line}`",
                    module.name
                );
                stamped.extend(kernels);
            }
        }
        for f in module.functions {
            let definition = format!(" {f}(");
            assert!(
                stamped.iter().any(|k| k == f) || module.source.contains(&definition),
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
