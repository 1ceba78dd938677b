//! `--sparse-adam`: recsys' embedding rows get torch.optim.SparseAdam's lazy
//! update (only the rows a step's batches looked up move), the rest dense
//! Adam; two ranks stay bitwise identical; the union of the ranks' rows is
//! the same whether the gradients travel as rows or dense; checkpoints keep
//! their format, so a run resumes exactly and with either optimizer; a GPU
//! (cuda-emu) trains with it; the finiteness guard, which reads only the
//! loss, the dense gradients and the step's rows of the tables, still
//! stops at a NaN in any of them, naming the step and the smallest index;
//! the flag is refused where it cannot work.

mod common;

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use comm::{CommConfig, TcpCommunicator};
use common::{free_port, run, stderr, trainer};
use core_tensor::ops::AdamConfig;
use core_tensor::{Cpu, FlatLayout, Ops};
use trainer::comm_thread::CommThread;
use trainer::ddp::SparseGrads;
use trainer::model::{DropoutRates, GradsReady, Metric, Mode, Model, RowTables};
use trainer::models::recsys::synth::write_ratings;
use trainer::models::recsys::{RatingsIndex, RatingsShard, RecsysBuffers, RecsysModel};
use trainer::train::{Setup, Silent, TrainConfig, Trainer};

const STEPS: usize = 12;
const BATCH: usize = 32;
const DIM: usize = 4;

fn config(sparse_adam: bool) -> TrainConfig {
    TrainConfig {
        epochs: 1,
        batch_size: BATCH,
        adam: AdamConfig::default(),
        seed: 5,
        max_steps: Some(STEPS),
        dropout: DropoutRates::OFF,
        bucket_mb: 25.0,
        sparse_grads: SparseGrads::Auto,
        sparse_adam,
        ..TrainConfig::new(1, 1)
    }
}

/// One rank's parameters after each step of one epoch (`comm`: of two).
fn params_after_each_step(
    index: &Arc<RatingsIndex>,
    sparse_adam: bool,
    comm: Option<CommThread>,
) -> Vec<Vec<f32>> {
    let model = RecsysModel::new(index, DIM)
        .unwrap()
        .with_tables_kept_zero(sparse_adam);
    let train = Box::new(RatingsShard::new(index.clone(), false));
    let setup = Setup::fresh(comm);
    let cpu = Cpu::new(1).unwrap();
    let mut t = Trainer::with_model(cpu, model, train, None, config(sparse_adam), setup).unwrap();
    let mut history = Vec::new();
    t.train_epoch(1, &mut Silent, &mut |t| {
        history.push(t.params()?);
        Ok(())
    })
    .unwrap();
    history
}

/// The embedding table: its range and row width.
fn table_of(model: &RecsysModel) -> (Range<usize>, usize) {
    RowTables::<RecsysBuffers<Cpu>>::tables(model)[0].clone()
}

/// The rows whose embedding (of `DIM`) or bias differs between `a` and `b`.
fn rows_moved(model: &RecsysModel, a: &[f32], b: &[f32]) -> usize {
    let (table, _) = table_of(model);
    let biases = Model::<Cpu>::layout(model).range("bias.weight").unwrap();
    let rows = (a[table.clone()].chunks(DIM)).zip(b[table].chunks(DIM));
    (rows.zip(a[biases.clone()].iter().zip(&b[biases])))
        .filter(|((x, y), (p, q))| x != y || p != q)
        .count()
}

/// A step moves at most the rows (embeddings and biases) its two ranks'
/// batches looked up (two per rating), where dense Adam keeps moving every
/// row seen since the start; and the ranks hold the same bits after every
/// step.
#[test]
fn two_ranks_move_only_their_batches_rows_and_stay_identical() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ratings.csv");
    // 5000 rows, of which a step touches at most 2·2·32 = 128.
    write_ratings(&path, 20_000, 3000, 2000, 3).unwrap();
    let index = Arc::new(RatingsIndex::build(&path).unwrap());
    let model = RecsysModel::new(&index, DIM).unwrap();
    let most = 2 * 2 * BATCH;
    for sparse_adam in [true, false] {
        let port = free_port();
        let ranks = common::on_two_ranks(|rank| {
            let cfg =
                CommConfig::new(rank, 2, "127.0.0.1", port).with_timeout(Duration::from_secs(20));
            let comm = CommThread::spawn(Box::new(TcpCommunicator::connect(&cfg).unwrap()));
            params_after_each_step(&index, sparse_adam, Some(comm.unwrap()))
        });
        assert_eq!(ranks[0].len(), STEPS);
        for (step, (a, b)) in ranks[0].iter().zip(&ranks[1]).enumerate() {
            let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(
                same,
                "sparse_adam {sparse_adam}: ranks differ after step {}",
                step + 1
            );
        }
        let moved: Vec<usize> = (ranks[0].windows(2))
            .map(|w| rows_moved(&model, &w[0], &w[1]))
            .collect();
        let most_moved = moved.iter().copied().max().unwrap();
        if sparse_adam {
            assert!(most_moved <= most, "rows moved per step: {moved:?}");
            assert!(most_moved > most / 2, "rows moved per step: {moved:?}");
        } else {
            assert!(
                most_moved > 3 * most,
                "dense Adam moves every row seen: {moved:?}"
            );
        }
    }
}

/// Where a NaN goes into the gradient, given the model and the rows the
/// batch looked up.
type Plant = fn(&RecsysModel, &[u32]) -> Vec<usize>;

/// recsys, whose backward at step [`PLANT_AT`] writes NaNs where `plant`
/// says (after averaging, as a bad all-reduce or kernel would leave them).
struct Planted {
    inner: RecsysModel,
    plant: Plant,
    steps: AtomicUsize,
    /// The flat indices planted.
    planted: Mutex<Vec<usize>>,
}

const PLANT_AT: usize = 3;

impl<B: Ops> Model<B> for Planted {
    type Buffers = RecsysBuffers<B>;

    fn kind(&self) -> &'static str {
        "recsys"
    }
    fn metric(&self) -> Metric {
        Metric::Rmse
    }
    fn layout(&self) -> &FlatLayout {
        Model::<B>::layout(&self.inner)
    }
    fn row_tables(&self) -> Option<&dyn RowTables<RecsysBuffers<B>>> {
        Model::<B>::row_tables(&self.inner)
    }
    fn init_params(&self, seed: u64) -> Vec<f32> {
        Model::<B>::init_params(&self.inner, seed)
    }
    fn buffers(&self, b: &B, batch: usize, train: bool) -> core_tensor::Result<Self::Buffers> {
        self.inner.buffers(b, batch, train)
    }
    fn forward(
        &self,
        b: &B,
        buf: &mut Self::Buffers,
        params: &B::Storage<f32>,
        mode: Mode,
    ) -> core_tensor::Result<()> {
        self.inner.forward(b, buf, params, mode)
    }
    fn metric_sum(
        &self,
        b: &B,
        buf: &Self::Buffers,
        sum: &mut B::Storage<f32>,
    ) -> core_tensor::Result<()> {
        self.inner.metric_sum(b, buf, sum)
    }
    fn loss(
        &self,
        b: &B,
        buf: &mut Self::Buffers,
        sum: &mut B::Storage<f32>,
    ) -> anyhow::Result<()> {
        self.inner.loss(b, buf, sum)
    }
    fn backward(
        &self,
        b: &B,
        buf: &mut Self::Buffers,
        params: &B::Storage<f32>,
        grads: &mut B::Storage<f32>,
        seed: trainer::model::DropoutSeed,
        hook: &mut dyn GradsReady<B>,
    ) -> anyhow::Result<()> {
        self.inner.backward(b, buf, params, grads, seed, hook)?;
        if self.steps.fetch_add(1, Ordering::Relaxed) + 1 == PLANT_AT {
            let rows = RowTables::<RecsysBuffers<B>>::rows(&self.inner, buf);
            for at in (self.plant)(&self.inner, rows) {
                b.write_range(&[f32::NAN], grads, at)?;
                self.planted.lock().unwrap().push(at);
            }
        }
        Ok(())
    }
}

/// A value in the middle row the step used of the embedding table.
fn plant_table_row(m: &RecsysModel, rows: &[u32]) -> Vec<usize> {
    let (table, dim) = table_of(m);
    vec![table.start + rows[rows.len() / 2] as usize * dim + 1]
}

/// The bias of the first row the step used.
fn plant_bias(m: &RecsysModel, rows: &[u32]) -> Vec<usize> {
    let biases = Model::<Cpu>::layout(m).range("bias.weight").unwrap();
    vec![biases.start + rows[0] as usize]
}

fn plant_dense(m: &RecsysModel, _: &[u32]) -> Vec<usize> {
    vec![Model::<Cpu>::layout(m).range("fc1.weight").unwrap().start + 5]
}

/// All three, the MLP's first: the guard checks the dense range first.
fn plant_all(m: &RecsysModel, rows: &[u32]) -> Vec<usize> {
    [plant_dense, plant_bias, plant_table_row]
        .iter()
        .flat_map(|plant| plant(m, rows))
        .collect()
}

/// Under `--sparse-adam` the guard reads the loss, the gradients outside
/// the tables and the step's rows of the embedding and the biases, not
/// the whole tables: a NaN planted in a row the step used or in a dense
/// gradient still stops training at that step, naming the smallest flat
/// index of all (the table lies first, the MLP last), and the step's
/// update is skipped. Had the guard left one of those parts out, the NaN
/// would reach the parameters and a later step's loss would trip it.
fn a_planted_nan_stops_at_its_step<B: Ops>(backend: &B) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ratings.csv");
    write_ratings(&path, 20_000, 3000, 2000, 3).unwrap();
    let index = Arc::new(RatingsIndex::build(&path).unwrap());
    for (what, plant) in [
        ("a used table row", plant_table_row as Plant),
        ("a used bias", plant_bias),
        ("fc1.weight", plant_dense),
        ("all three", plant_all),
    ] {
        let model = Planted {
            inner: RecsysModel::new(&index, DIM)
                .unwrap()
                .with_tables_kept_zero(true),
            plant,
            steps: AtomicUsize::new(0),
            planted: Mutex::new(Vec::new()),
        };
        let train = Box::new(RatingsShard::new(index.clone(), false));
        let (cfg, setup) = (config(true), Setup::fresh(None));
        let mut t = Trainer::with_model(backend.clone(), model, train, None, cfg, setup).unwrap();
        let mut history = Vec::new();
        let err = t
            .train_epoch(1, &mut Silent, &mut |t| {
                history.push(t.params()?);
                Ok(())
            })
            .unwrap_err();
        let err = format!("{err:#}");
        let planted = t.model().planted.lock().unwrap().clone();
        let smallest = planted.iter().min().unwrap();
        // The CPU reads the guard every step, a GPU at the epoch's end.
        let at_step = match B::IN_HOST_MEMORY {
            true => format!("epoch 1, step {PLANT_AT}: non-finite gradient"),
            false => format!("at optimizer step {PLANT_AT} (noticed"),
        };
        assert!(
            err.contains(&at_step) && err.contains(&format!("flat index {smallest})")),
            "{what}, planted at {planted:?}: {err}"
        );
        let before = &history[PLANT_AT - 2];
        let now = t.params().unwrap();
        assert!(
            now.iter()
                .zip(before)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{what}: the bad step moved the parameters"
        );
    }
}

#[test]
fn a_planted_nan_stops_training_at_its_step_on_the_cpu() {
    a_planted_nan_stops_at_its_step(&Cpu::new(1).unwrap());
}

/// Trains `extra` on two ranks over the binary; the files of the final
/// checkpoint and rank 0's stderr.
fn train(ratings: &Path, ckpt: &Path, extra: &[&str]) -> (Vec<(PathBuf, Vec<u8>)>, String) {
    let out = run(trainer()
        .args(["--model", "recsys", "--ratings"])
        .arg(ratings)
        .args(["--world-size", "2", "--epochs", "2", "--batch-size", "64"])
        .args(["--sparse-adam", "--checkpoint-dir"])
        .arg(ckpt)
        .args(extra));
    assert!(out.status.success(), "{extra:?}: {}", stderr(&out));
    let end = ckpt.join("ckpt-e0003-s000000");
    let mut files: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(&end)
        .unwrap_or_else(|e| panic!("{}: {e}\n{}", end.display(), stderr(&out)))
        .map(|e| e.unwrap().path())
        .map(|p| {
            let bytes = common::without_flag_record(&p, std::fs::read(&p).unwrap());
            (p.file_name().unwrap().into(), bytes)
        })
        .collect();
    files.sort();
    (files, stderr(&out))
}

/// Tables the dense all-reduce moves more cheaply (39 rows of one and
/// their biases, 33 of them ids, each rank's batch touching most of those,
/// not all: 59 rows in all, three floats each, against four a table row
/// densely): the union the ranks gather for the lazy update beside it is
/// the row path's, bit for bit.
#[test]
fn the_dense_exchange_updates_the_same_rows_as_the_row_exchange() {
    let dir = tempfile::tempdir().unwrap();
    let ratings = dir.path().join("ratings.csv");
    write_ratings(&ratings, 5_000, 30, 3, 4).unwrap();
    let small = [
        "--device",
        "cpu",
        "--embedding-dim",
        "1",
        "--max-steps",
        "10",
    ];
    let mut auto = small.to_vec();
    auto.extend(["--sparse-grads", "auto"]);
    let (dense, err) = train(&ratings, &dir.path().join("auto"), &auto);
    let chose = err
        .lines()
        .find(|l| l.contains("sparse gradients, first step"));
    assert!(chose.is_some_and(|l| l.ends_with("dense")), "{err}");
    let mut always = small.to_vec();
    always.extend(["--sparse-grads", "always"]);
    let (rows, _) = train(&ratings, &dir.path().join("always"), &always);
    assert!(dense == rows, "the dense and the row exchange differ");
}

/// Straight through two epochs, or resumed from a mid-epoch checkpoint:
/// the same epochs and the same final checkpoint, byte for byte; and the
/// checkpoint resumes with dense Adam too.
#[test]
fn a_mid_epoch_checkpoint_resumes_exactly_with_either_optimizer() {
    let dir = tempfile::tempdir().unwrap();
    let ratings = dir.path().join("ratings.csv");
    write_ratings(&ratings, 8_000, 300, 200, 2).unwrap();
    let cpu = ["--device", "cpu", "--keep", "100"];
    let first = dir.path().join("a");
    let mut args = cpu.to_vec();
    args.extend(["--checkpoint-every", "20"]);
    let (straight, _) = train(&ratings, &first, &args);
    let mid = first.join("ckpt-e0001-s000020");
    let mut args = cpu.to_vec();
    args.extend(["--resume", mid.to_str().unwrap()]);
    let (resumed, err) = train(&ratings, &dir.path().join("b"), &args);
    assert!(straight == resumed, "the resumed run ends elsewhere: {err}");
    let dense = run(trainer()
        .args(["--model", "recsys", "--device", "cpu", "--ratings"])
        .arg(&ratings)
        .args(["--world-size", "2", "--epochs", "1", "--batch-size", "64"])
        .args(["--resume", mid.to_str().unwrap()]));
    assert!(dense.status.success(), "{}", stderr(&dense));
}

/// Re-runs `emulated_gpu_trains_with_sparse_adam` on cuda-emu; in the first
/// run it returns at once.
#[test]
fn sparse_adam_on_the_cuda_emulator() {
    common::rerun_on_emulated_gpus(1, &["emulated_gpu_trains_with_sparse_adam"]);
}

/// Two ranks on one emulated GPU over the TCP ring: the lazy step's kernel
/// and the dense one's over the rest, as rows and as the dense exchange;
/// and the guard's kernels in parts, stopping at a planted NaN.
#[test]
fn emulated_gpu_trains_with_sparse_adam() {
    let Some(gpu) = common::emulated_gpu(0) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ratings = dir.path().join("ratings.csv");
    write_ratings(&ratings, 5_000, 300, 200, 3).unwrap();
    for mode in ["always", "auto"] {
        let gpu = ["--device", "cuda", "--backend", "tcp", "--max-steps", "4"];
        let mut args = gpu.to_vec();
        args.extend(["--sparse-grads", mode]);
        train(&ratings, &dir.path().join(mode), &args);
    }
    a_planted_nan_stops_at_its_step(&gpu);
}

#[test]
fn the_flag_is_refused_where_it_cannot_work() {
    let dir = tempfile::tempdir().unwrap();
    let ratings = dir.path().join("ratings.csv");
    write_ratings(&ratings, 500, 30, 20, 1).unwrap();
    let recsys = ["--model", "recsys", "--ratings", ratings.to_str().unwrap()];
    for (args, says) in [
        (
            &["--model", "toy", "--sparse-adam"][..],
            "it is for --model recsys",
        ),
        (
            &[&recsys[..], &["--sparse-adam", "--sparse-grads", "never"]].concat(),
            "--sparse-grads never",
        ),
        (
            &[
                &recsys[..],
                &["--sparse-adam", "--backend", "nccl", "--device", "cuda"],
            ]
            .concat(),
            "--backend nccl",
        ),
    ] {
        let out = run(trainer().args(args));
        assert!(!out.status.success(), "{args:?} ran");
        let err = stderr(&out);
        assert!(
            err.contains("--sparse-adam") && err.contains(says),
            "{args:?}: {err}"
        );
    }
}
