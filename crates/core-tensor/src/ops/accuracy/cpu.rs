use super::AccuracyKernel;
use crate::error::check_len;
use crate::ops::ClassGeom;
use crate::{Cpu, Result};

impl AccuracyKernel for Cpu {
    fn count_correct(
        &self,
        g: &ClassGeom,
        logits: &Vec<f32>,
        labels: &Vec<u8>,
        correct: &mut Vec<f32>,
    ) -> Result<()> {
        g.check::<Self>(logits, labels)?;
        check_len("count_correct", "correct", correct.len(), 1)?;
        let hits = logits
            .chunks(g.classes)
            .zip(labels)
            .filter(|(row, label)| {
                let argmax = row
                    .iter()
                    .enumerate()
                    .fold(0, |best, (i, &v)| if v > row[best] { i } else { best });
                argmax == usize::from(**label)
            })
            .count();
        correct[0] += hits as f32;
        Ok(())
    }
}
