use super::*;

fn covers_k_exactly(plan: &GemmPlan, k: usize) {
    assert_eq!(plan.k_chunk % BK, 0, "{plan:?}");
    assert!(
        plan.splits * plan.k_chunk >= k,
        "{plan:?} misses part of k = {k}"
    );
    assert!(
        k == 0 || (plan.splits - 1) * plan.k_chunk < k,
        "{plan:?}: the last split of k = {k} is empty"
    );
}

#[test]
fn a_long_k_behind_few_tiles_is_split() {
    // conv2's weight gradient at batch 64: 64 x 288 outputs, K = 64·24·24.
    let k = 64 * 24 * 24;
    let plan = GemmPlan::new("test", 64, 288, k, Fp32Tile::Square).unwrap();
    assert!(plan.is_split());
    assert!(plan.k_chunk >= MIN_K_CHUNK);
    let blocks = plan.tiles_m * plan.tiles_n * plan.splits;
    assert!(
        (TARGET_BLOCKS..2 * TARGET_BLOCKS).contains(&blocks),
        "{plan:?}"
    );
    covers_k_exactly(&plan, k);
    assert_eq!(plan.workspace_len(), plan.splits * 64 * 288);
}

#[test]
fn no_workspace_is_larger_than_its_bound() {
    let sizes = [1, 7, 10, 32, 33, 64, 100, 288, 1000, 4096, 36864, 1 << 20];
    for (m, n, k) in (sizes.iter())
        .flat_map(|&m| sizes.iter().map(move |&n| (m, n)))
        .flat_map(|(m, n)| [1, 300, 20000, 1 << 24].map(|k| (m, n, k)))
    {
        for tile in [Fp32Tile::Square, Fp32Tile::Wide] {
            let Ok(plan) = GemmPlan::new("test", m, n, k, tile) else {
                continue;
            };
            let len = if plan.is_split() {
                plan.workspace_len()
            } else {
                0
            };
            assert!(len <= MAX_WORKSPACE_LEN, "{m}x{n}x{k}: {plan:?}");
        }
    }
}

#[test]
fn many_tiles_or_a_short_k_stay_whole() {
    // conv2's forward pass at batch 64: 64 x 36864 outputs, K = 288.
    let plan = GemmPlan::new("test", 64, 64 * 24 * 24, 288, Fp32Tile::Square).unwrap();
    assert!(!plan.is_split());
    covers_k_exactly(&plan, 288);
    // fc2: a single tile, but K = 128 is below one minimum chunk.
    let plan = GemmPlan::new("test", 64, 10, 128, Fp32Tile::Square).unwrap();
    assert!(!plan.is_split());
    covers_k_exactly(&plan, 128);
}

#[test]
fn short_wide_products_take_the_32_row_tile() {
    // conv2's input gradient at batch 64: 32 channels x 64·26·26 pixels.
    let plan = GemmPlan::new("test", 32, 64 * 26 * 26, 576, Fp32Tile::Square).unwrap();
    assert_eq!(plan.tile_m, 32);
    assert_eq!(
        plan.tiles().grid_dim,
        ((64 * 26 * 26usize).div_ceil(128) as u32, 1, 1)
    );
    assert_eq!(plan.args(()).tiling.tile_m, 32);
    // 33 rows, or an output too narrow for 128 columns, keep 64 x 64.
    assert_eq!(
        GemmPlan::new("test", 33, 10_000, 16, Fp32Tile::Square)
            .unwrap()
            .tile_m,
        64
    );
    assert_eq!(
        GemmPlan::new("test", 32, 64, 16, Fp32Tile::Square)
            .unwrap()
            .tile_m,
        64
    );
}

#[test]
fn wide_tiles_take_wide_products_and_split_k_as_the_square_ones() {
    // conv2's forward pass at batch 64: 64 x 36864 outputs in 64 x 256.
    let n = 64 * 24 * 24;
    let plan = GemmPlan::new("test", 64, n, 288, Fp32Tile::Wide).unwrap();
    assert_eq!((plan.tile_m, plan.tile_n), (64, 256));
    assert!(plan.is_wide());
    assert_eq!(plan.tiles().grid_dim, (n.div_ceil(256) as u32, 1, 1));
    assert_eq!(plan.args(()).tiling.tile_n, 256);
    // A wide plan takes the wide kinds, in the products' precision and
    // staging; bf16, which has no wide tiles, never meets one (its
    // products' tile is square), and would take its one kind.
    let wide = |precision, staging| {
        let products = Products::new(precision, Fp32Tile::Wide, staging).unwrap();
        plan.variant(products)
    };
    use crate::GemmStaging::{CpAsync, Registers};
    use crate::MatmulPrecision::{Fp32, Tf32};
    assert_eq!(wide(Fp32, Registers), GemmVariant::F32Wide);
    assert_eq!(wide(Fp32, CpAsync), GemmVariant::F32WideCp);
    assert_eq!(wide(Tf32, Registers), GemmVariant::Tf32Wide);
    assert_eq!(wide(Tf32, CpAsync), GemmVariant::Tf32WideCp);
    assert_eq!(plan.variant(Products::Bf16), GemmVariant::Bf16);
    // conv2's input gradient: at most 32 rows keep 32 x 128.
    let short = GemmPlan::new("test", 32, 64 * 26 * 26, 576, Fp32Tile::Wide).unwrap();
    assert_eq!((short.tile_m, short.tile_n), (32, 128));
    // Fewer than four wide tiles across keep the square tiles: conv2's
    // weight gradient (288 columns), and 1023 columns.
    let narrow = GemmPlan::new("test", 64, 288, 64 * 576, Fp32Tile::Wide).unwrap();
    assert_eq!((narrow.tile_m, narrow.tile_n), (64, 64));
    assert!(!narrow.is_wide());
    // Asked for wide tiles, a product kept in the square ones takes the
    // square kinds.
    let tf32_wide = Products::new(Tf32, Fp32Tile::Wide, CpAsync).unwrap();
    assert_eq!(narrow.variant(tf32_wide), GemmVariant::Tf32Cp);
    let f32_wide = Products::new(Fp32, Fp32Tile::Wide, Registers).unwrap();
    assert_eq!(narrow.variant(f32_wide), GemmVariant::F32);
    let just_narrow = GemmPlan::new("test", 64, 1023, 576, Fp32Tile::Wide).unwrap();
    assert_eq!((just_narrow.tile_m, just_narrow.tile_n), (64, 64));
    let just_wide = GemmPlan::new("test", 65, 1024, 576, Fp32Tile::Wide).unwrap();
    assert_eq!((just_wide.tile_m, just_wide.tile_n), (64, 256));
    // Every sum is cut into the same splits, whichever tile runs.
    for (m, n, k) in [
        (64, 288, 64 * 576),
        (32, 9, 64 * 676),
        (128, 9216, 64),
        (200, 1000, 5000),
    ] {
        let square = GemmPlan::new("test", m, n, k, Fp32Tile::Square).unwrap();
        let wide = GemmPlan::new("test", m, n, k, Fp32Tile::Wide).unwrap();
        assert_eq!(
            (wide.splits, wide.k_chunk),
            (square.splits, square.k_chunk),
            "{m}x{n}x{k}"
        );
        covers_k_exactly(&wide, k);
    }
}

#[test]
fn a_long_reduce_takes_a_warp_per_element() {
    // conv1's weight gradient at batch 64: 32 x 9 outputs, K = 64·26·26.
    let plan = GemmPlan::new("test", 32, 9, 64 * 26 * 26, Fp32Tile::Square).unwrap();
    assert!(plan.splits >= WIDE_REDUCE_SPLITS, "{plan:?}");
    assert_eq!(
        plan.reduce().grid_dim,
        ((32 * 9usize).div_ceil(8) as u32, 1, 1)
    );
    // A short chain keeps a thread per element.
    let plan = GemmPlan::new("test", 64, 288, 4 * 24 * 24, Fp32Tile::Square).unwrap();
    assert!(
        plan.is_split() && plan.splits < WIDE_REDUCE_SPLITS,
        "{plan:?}"
    );
    assert_eq!(
        plan.reduce().grid_dim,
        ((64 * 288usize).div_ceil(256) as u32, 1, 1)
    );
}

#[test]
fn empty_k_runs_one_split() {
    let plan = GemmPlan::new("test", 3, 5, 0, Fp32Tile::Square).unwrap();
    assert_eq!((plan.splits, plan.k_chunk), (1, BK));
    assert_eq!(plan.tiles().grid_dim, (1, 1, 1));
}

#[test]
fn the_plan_covers_k_for_every_shape() {
    for m in [1, 63, 64, 65, 200] {
        for n in [1, 64, 1000] {
            for k in [1, 15, 16, 17, 255, 256, 257, 5000, 100_000] {
                covers_k_exactly(
                    &GemmPlan::new("test", m, n, k, Fp32Tile::Square).unwrap(),
                    k,
                );
            }
        }
    }
}

#[test]
fn products_beyond_32_bit_indexing_are_refused() {
    let err = GemmPlan::new("test", 1 << 16, 1 << 16, 16, Fp32Tile::Square).unwrap_err();
    assert!(err.to_string().contains("32-bit"), "{err}");
    assert!(check_i32("test", &[1 << 31]).is_err());
    assert!(check_i32("test", &[(1 << 31) - 1]).is_ok());
}
