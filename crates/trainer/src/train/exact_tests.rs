use super::*;

/// The units split over replicas as evenly as they go, in order; too few
/// units or a batch not cut into whole units are refused naming the flag.
#[test]
fn units_are_shared_out_in_runs_and_bad_batches_are_refused() {
    let request = |global_batch| ExactRequest {
        global_batch,
        unit: 16,
    };
    let shares: Vec<_> = (0..3)
        .map(|r| UnitPlan::new(request(Some(128)), 64, (r, 3)).unwrap().share)
        .collect();
    assert_eq!(shares, [0..3, 3..6, 6..8]);
    assert_eq!(
        UnitPlan::new(request(None), 64, (1, 2))
            .unwrap()
            .global_batch,
        128
    );
    let refusal = |b, replicas| {
        format!(
            "{:#}",
            UnitPlan::new(request(b), 64, (0, replicas)).unwrap_err()
        )
    };
    assert!(refusal(Some(100), 1).contains("not a multiple of --unit 16"));
    assert!(refusal(Some(32), 4).contains("--global-batch 64 or more"));
    assert!(refusal(Some(16 * 5000), 1).contains("larger --unit"));
}

#[test]
fn rounding_to_an_integer_is_to_nearest_even_within_the_range() {
    for (x, want) in [
        (0.5, 0),
        (1.5, 2),
        (2.5, 2),
        (-0.5, 0),
        (-1.5, -2),
        (-2.7, -3),
        (3.2, 3),
        (2f64.powi(51) - 1.0, (1i64 << 51) - 1),
        (-(2f64.powi(51)), -(1i64 << 51)),
    ] {
        assert_eq!(round_to_integer(x), want, "{x}");
    }
}
