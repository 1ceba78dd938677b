use super::*;

/// How a parameter's Rust type is spelled in C.
pub(super) trait CType {
    const NAME: &'static str;
}

macro_rules! c_types {
    ($($rust:ty => $c:literal),* $(,)?) => {
        $(impl CType for $rust {
            const NAME: &'static str = $c;
        })*
    };
}

c_types! {
    f32 => "float",
    u8 => "unsigned char",
    u16 => "unsigned short",
    u32 => "unsigned int",
    u64 => "unsigned long long",
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

/// How `kernel` (or GEMM family `kernel`, whose entry point a macro
/// defines as `kernel##SUFFIX`) is named where it is defined.
fn defined_as(kernel: &str, family: bool) -> String {
    if family {
        format!(" {kernel}##SUFFIX(")
    } else {
        format!(" {kernel}(")
    }
}

/// The parameter types of the definition `defined` (a [`defined_as`])
/// in `source`, one space between words and none before a `*` (a
/// macro's line continuations left out).
fn c_parameter_types(source: &str, defined: &str) -> Vec<String> {
    let start = source
        .find(defined)
        .unwrap_or_else(|| panic!("no `{defined}` in its source"))
        + defined.len();
    let end = start + source[start..].find(')').expect("a closing parenthesis");
    source[start..end]
        .split(',')
        .map(|param| {
            let words: Vec<&str> = param.split_whitespace().filter(|w| *w != "\\").collect();
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

/// The launchers push what the kernels take: each declaration in the
/// table spells the C signature of its kernel (or GEMM family's entry
/// point), type for type.
#[test]
fn every_declared_signature_matches_its_source() {
    let mut checked = 0;
    for &(kernel, family, params) in SIGNATURES {
        let name = |suffix: &str| format!("{kernel}{suffix}");
        let first = if family { name("_f32") } else { name("") };
        let module = kernel_modules()
            .iter()
            .find(|m| m.functions().any(|f| f == first))
            .expect("every declared kernel is in a module");
        let declared: Vec<String> = params
            .iter()
            .map(|&(kind, c)| match kind {
                "In" => format!("const {c}*"),
                "Out" => format!("{c}*"),
                _ => c.to_owned(),
            })
            .collect();
        assert_eq!(
            declared,
            c_parameter_types(module.source, &defined_as(kernel, family)),
            "{kernel}: the table's declaration differs from {}.cu",
            module.name
        );
        checked += if family {
            module
                .functions()
                .filter(|f| f.strip_prefix(kernel).is_some_and(is_variant_suffix))
                .count()
        } else {
            1
        };
    }
    let listed: usize = kernel_modules().iter().map(|m| m.functions().count()).sum();
    assert_eq!(checked, listed);
}

/// Whether `rest` is a GEMM variant's suffix (`_f32`, `_tf32w_cp`, ...).
fn is_variant_suffix(rest: &str) -> bool {
    let names = [gemm_names!(square x).as_slice(), &gemm_names!(wide x)].concat();
    names.iter().any(|n| n.strip_prefix('x') == Some(rest))
}

/// Every family's entry points follow [`GemmVariant`]'s order, so that
/// its launcher picks the variant it is asked for: `Tf32WideCp` is
/// `_tf32w_cp`.
#[test]
fn gemm_entry_points_are_in_the_variants_order() {
    let (square, wide) = (gemm_names!(square x), gemm_names!(wide x));
    for variant in GemmVariant::ALL {
        let name = format!("{variant:?}");
        let cp = name.strip_suffix("Cp");
        let name = cp.unwrap_or(&name);
        let wide_tile = name.strip_suffix("Wide");
        let precision = wide_tile.unwrap_or(name).to_lowercase();
        let suffix = format!(
            "_{precision}{}{}",
            if wide_tile.is_some() { "w" } else { "" },
            if cp.is_some() { "_cp" } else { "" }
        );
        let entry = gemm_entry("x", &[&square, &wide], variant).unwrap();
        assert_eq!(entry, format!("x{suffix}"), "{variant:?}");
    }
    let listed = square.len() + wide.len();
    assert_eq!(
        listed,
        GemmVariant::ALL.len(),
        "one entry point per variant"
    );
    let wide = gemm_entry("x", &[&square], GemmVariant::F32Wide);
    assert!(wide.is_err(), "a square family has no wide entry point");
}

#[test]
fn every_listed_kernel_is_defined_in_its_source() {
    for module in kernel_modules() {
        for f in module.functions() {
            let family = SIGNATURES
                .iter()
                .find(|(k, fam, _)| *fam && f.strip_prefix(k).is_some_and(is_variant_suffix));
            let definition = match family {
                Some((kernel, ..)) => defined_as(kernel, true),
                None => defined_as(f, false),
            };
            assert!(
                module.source.contains(&definition),
                "{}: no `{definition}` in the source",
                module.name
            );
        }
    }
}

#[test]
fn every_kernel_name_is_unique() {
    let mut names: Vec<_> = kernel_modules()
        .iter()
        .flat_map(|m| m.functions())
        .collect();
    let total = names.len();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), total);
}
