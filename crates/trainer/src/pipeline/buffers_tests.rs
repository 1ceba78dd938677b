use core_tensor::Cpu;

use super::*;

/// Stage 0's training buffers for micro-batches of `sizes`.
fn front(sizes: &[usize]) -> (Slotted<FrontActs<Cpu>, Images<Cpu>>, SharedGrads<Cpu>) {
    let cpu = Cpu::new(1).unwrap();
    match PipeBuffers::new(&cpu, 0, sizes, true).unwrap().acts {
        StageActs::Front(acts, grads) => (acts, grads),
        StageActs::Back(_) => panic!("stage 0 built the last stage's buffers"),
    }
}

#[test]
fn stage_0s_slots_have_gradients_only_while_lent_and_get_them_back_on_errors() {
    let (mut acts, mut grads) = front(&[16, 16, 16]);
    for i in 0..2 {
        assert!(
            acts.slot(i).cut.dpooled_mut().is_err(),
            "slot {i} holds gradients"
        );
    }
    let failed: anyhow::Result<()> = grads.lend(16, acts.slot(0), |act| {
        assert!(act.cut.dpooled_mut().is_ok(), "lent, yet no gradients");
        anyhow::bail!("the exchange failed")
    });
    assert!(failed.is_err());
    assert!(
        acts.slot(0).cut.dpooled_mut().is_err(),
        "kept after a failure"
    );
    // Taken back, so the next micro-batch borrows them, in the other slot.
    let lent = grads.lend(16, acts.slot(1), |act| Ok(act.cut.dpooled_mut().is_ok()));
    assert!(lent.unwrap());
}

#[test]
fn each_micro_batch_size_borrows_gradients_of_its_own_size() {
    let (mut acts, mut grads) = front(&[13, 13, 12, 12]);
    assert_eq!(grads.0.len(), 2, "one set per size");
    for (i, n) in [(0, 13), (2, 12)] {
        let pooled = acts.slot(i).cut.pooled.len();
        let len = grads.lend(n, acts.slot(i), |act| Ok(act.cut.dpooled_mut()?.len()));
        assert_eq!(len.unwrap(), pooled, "micro-batch {i} of {n}");
    }
    let err = grads.lend(7, acts.slot(0), |_| Ok(())).unwrap_err();
    assert!(err.to_string().contains("built for training"), "{err}");
}
