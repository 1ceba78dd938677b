use clap::Parser;

use super::*;
use crate::checkpoint::resume::ResumeFrom;
use crate::ddp::{BackendChoice, CommHookChoice, SparseGrads};
use crate::run::DeviceChoice;

fn parse(args: &[&str]) -> Result<Cli, String> {
    Cli::try_parse_from(std::iter::once("trainer").chain(args.iter().copied()))
        .map_err(|e| e.to_string())
}

#[test]
fn defaults_are_the_reference_settings() {
    let cli = parse(&[]).unwrap();
    let job = cli.job;
    let train = &job.train;
    assert_eq!(
        (train.epochs, train.batch_size, train.lr, train.seed),
        (5, 64, 1e-3, 0)
    );
    assert_eq!(job.device.device, DeviceChoice::Auto);
    assert_eq!(job.ddp.backend, BackendChoice::Auto);
    assert_eq!(job.ddp.bucket_mb, 25.0);
    assert_eq!(job.ddp.sparse_grads, SparseGrads::Auto);
    assert_eq!(job.ddp.comm_hook, CommHookChoice::None);
    assert_eq!(job.train.accumulate_steps, 1);
    let checkpoints = job.checkpoints;
    assert_eq!(
        (
            checkpoints.checkpoint_dir,
            checkpoints.keep,
            cli.launch.max_restarts,
            checkpoints.resume
        ),
        (None, 3, 0, None)
    );
}

#[test]
fn checkpoint_flags_that_need_a_directory_say_so() {
    for (args, needle) in [
        (
            &["--checkpoint-every", "5"][..],
            "--checkpoint-every needs --checkpoint-dir",
        ),
        (
            &["--max-restarts", "1"],
            "--max-restarts needs --checkpoint-dir",
        ),
        (
            &["--resume", "auto"],
            "--resume auto needs --checkpoint-dir",
        ),
        (
            &["--resume", "x", "--init-from", "w.safetensors"],
            "give one",
        ),
    ] {
        let err = parse(args).unwrap().validate().unwrap_err().to_string();
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    let ok = parse(&[
        "--checkpoint-dir",
        "d",
        "--resume",
        "auto",
        "--init-from",
        "w.safetensors",
        "--max-restarts",
        "2",
    ])
    .unwrap();
    ok.validate().unwrap();
    assert_eq!(ok.job.checkpoints.resume, Some(ResumeFrom::Auto));
    assert_eq!(
        parse(&["--resume", "d/ckpt-e0002-s000000"])
            .unwrap()
            .job
            .checkpoints
            .resume,
        Some(ResumeFrom::Path("d/ckpt-e0002-s000000".into()))
    );
}

#[test]
fn gpu_only_flags_with_the_cpu_are_refused_before_anything_starts() {
    for (flags, hint) in [
        (&["--backend", "nccl"][..], "--backend tcp"),
        (&["--tf32"], "--tf32"),
        (&["--bf16"], "--bf16"),
        (&["--precision", "tf32"], "--precision tf32"),
        (&["--precision", "bf16"], "--precision bf16"),
        (&["--fp32-tile", "wide"], "--fp32-tile"),
        (&["--gemm-staging", "cp-async"], "--gemm-staging"),
        (&["--no-fusion"], "--no-fusion"),
    ] {
        let cpu = [&["--device", "cpu"][..], flags].concat();
        let err = parse(&cpu).unwrap().validate().unwrap_err().to_string();
        assert!(err.contains(hint), "{err}");
        for device in ["auto", "cuda"] {
            let gpu = [&["--device", device][..], flags].concat();
            parse(&gpu).unwrap().validate().unwrap();
        }
    }
    for backend in ["auto", "tcp"] {
        parse(&["--device", "cuda", "--backend", backend])
            .unwrap()
            .validate()
            .unwrap();
    }
    // The wide tiles run the tensor cores' products too.
    parse(&["--tf32", "--fp32-tile", "wide"])
        .unwrap()
        .validate()
        .unwrap();
    let both = parse(&["--bf16", "--fp32-tile", "wide"])
        .unwrap()
        .validate();
    assert!(both.unwrap_err().to_string().contains("--bf16"));
    let bf16 = parse(&["--bf16", "--gemm-staging", "cp-async"])
        .unwrap()
        .validate();
    assert!(bf16.unwrap_err().to_string().contains("--bf16"));
    parse(&[
        "--tf32",
        "--fp32-tile",
        "wide",
        "--gemm-staging",
        "cp-async",
    ])
    .unwrap()
    .validate()
    .unwrap();
    let err = parse(&["--gemm-staging", "ldgsts"])
        .unwrap_err()
        .to_string();
    assert!(err.contains("registers or cp-async"), "{err}");
    // One precision for the products: TF32 or bf16, not both.
    let both = parse(&["--tf32", "--bf16"]).unwrap().validate();
    let err = both.unwrap_err().to_string();
    assert!(err.contains("--tf32") && err.contains("--bf16"), "{err}");
}

/// `--precision` is the one value; `--tf32` and `--bf16` are its aliases,
/// which may repeat it but not contradict it, and bf16's tile and staging
/// are refused as with `--bf16`.
#[test]
fn precision_is_one_value_with_its_aliases() {
    use core_tensor::{MatmulPrecision, Products};
    let precision = |args: &[&str]| parse(args).unwrap().job.device.precision();
    assert_eq!(precision(&[]).unwrap(), (MatmulPrecision::Fp32, None));
    for (args, want) in [
        (&["--precision", "f32"][..], MatmulPrecision::Fp32),
        (&["--precision", "tf32"], MatmulPrecision::Tf32),
        (&["--tf32"], MatmulPrecision::Tf32),
        (&["--precision", "tf32", "--tf32"], MatmulPrecision::Tf32),
        (&["--precision", "bf16", "--bf16"], MatmulPrecision::Bf16),
    ] {
        assert_eq!(precision(args).unwrap().0, want, "{args:?}");
        parse(args).unwrap().validate().unwrap();
    }
    for (args, named) in [
        (
            &["--precision", "f32", "--tf32"][..],
            ["--precision f32", "--tf32"],
        ),
        (
            &["--precision", "tf32", "--bf16"],
            ["--precision tf32", "--bf16"],
        ),
    ] {
        let err = parse(args).unwrap().validate().unwrap_err().to_string();
        assert!(named.iter().all(|n| err.contains(n)), "{err}");
        assert!(err.contains("two precisions"), "{err}");
    }
    let err = parse(&["--precision", "fp8"]).unwrap_err().to_string();
    assert!(err.contains("f32, tf32 or bf16"), "{err}");
    for flags in [
        &["--fp32-tile", "wide"][..],
        &["--gemm-staging", "cp-async"],
    ] {
        let args = [&["--precision", "bf16"][..], flags].concat();
        let err = parse(&args).unwrap().validate().unwrap_err().to_string();
        assert!(
            err.contains(flags[0]) && err.contains("--precision bf16"),
            "{err}"
        );
    }
    let tf32 = parse(&["--precision", "tf32", "--fp32-tile", "wide"]).unwrap();
    assert!(matches!(
        tf32.job.device.products().unwrap(),
        Products::Tf32 { .. }
    ));
}

#[test]
fn flags_that_cannot_apply_are_refused() {
    for (args, needle) in [
        (&["--sparse-grads", "never"][..], "it is for --model recsys"),
        (
            &["--pipeline-stages", "5"],
            "--model cnn splits into at most 4 stages",
        ),
        (
            &["--model", "toy", "--pipeline-stages", "3"][..],
            "--model toy splits into at most 2 stages",
        ),
        (
            &["--model", "recsys", "--pipeline-stages", "2"],
            "--pipeline-stages means nothing to --model recsys: it is for --model cnn or --model toy",
        ),
        (&["--samples", "10"], "--samples is for --model toy"),
        (
            &["--model", "toy", "--ratings", "r.csv"],
            "--ratings is for --model recsys",
        ),
        (
            &["--model", "recsys"],
            "--model recsys trains on --ratings PATH",
        ),
        (
            &[
                "--pipeline-stages",
                "2",
                "--batch-size",
                "8",
                "--micro-batches",
                "9",
            ],
            "--micro-batches 9 is more than --batch-size 8",
        ),
    ] {
        let err = parse(args).unwrap().validate().unwrap_err().to_string();
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    let ok = [
        "--pipeline-stages",
        "2",
        "--batch-size",
        "8",
        "--micro-batches",
        "8",
    ];
    parse(&ok).unwrap().validate().unwrap();
}

#[test]
fn accumulation_and_hooks_that_cannot_apply_are_refused() {
    for (args, needle) in [
        (
            &["--pipeline-stages", "2", "--accumulate-steps", "4"][..],
            "use --batch-size 256 --micro-batches 16 instead",
        ),
        (
            &["--backend", "nccl", "--comm-hook", "powersgd:1"],
            "NCCL carries bf16 and fp16 only: use --backend tcp",
        ),
        (
            &["--pipeline-stages", "2", "--comm-hook", "powersgd:4:10"],
            "--comm-hook powersgd:4:10 keeps per-rank state",
        ),
        (
            &[
                "--model",
                "recsys",
                "--ratings",
                "r.csv",
                "--accumulate-steps",
                "2",
            ],
            "--accumulate-steps means nothing to --model recsys",
        ),
        (
            &[
                "--model",
                "recsys",
                "--ratings",
                "r.csv",
                "--comm-hook",
                "bf16",
            ],
            "--comm-hook means nothing to --model recsys",
        ),
    ] {
        let err = parse(args).unwrap().validate().unwrap_err().to_string();
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    for ok in [
        &["--accumulate-steps", "4", "--comm-hook", "bf16"][..],
        &["--pipeline-stages", "2", "--comm-hook", "fp16"],
        &[
            "--model",
            "toy",
            "--accumulate-steps",
            "2",
            "--comm-hook",
            "powersgd:1:0",
        ],
    ] {
        parse(ok).unwrap().validate().unwrap();
    }
    let hook = parse(&["--comm-hook", "powersgd:4"])
        .unwrap()
        .job
        .ddp
        .comm_hook;
    assert_eq!(
        hook,
        CommHookChoice::PowerSgd {
            rank: 4,
            start: 1000
        }
    );
    assert_eq!(hook.to_string(), "powersgd:4:1000");
}

#[test]
fn bad_values_are_rejected_with_the_flag_named() {
    for (args, flag) in [
        (&["--batch-size", "0"][..], "--batch-size"),
        (&["--epochs", "0"], "--epochs"),
        (&["--lr", "-1"], "--lr"),
        (&["--lr", "NaN"], "--lr"),
        (&["--lr", "inf"], "--lr"),
        (&["--device", "tpu"], "--device"),
        (&["--keep", "0"], "--keep"),
        (&["--checkpoint-every", "0"], "--checkpoint-every"),
        (&["--resume", ""], "--resume"),
        (&["--backend", "mpi"], "--backend"),
        (&["--model", "mlp"], "--model"),
        (&["--accumulate-steps", "0"], "--accumulate-steps"),
        (&["--link-mbps", "0"], "--link-mbps"),
        (&["--comm-hook", "int8"], "unknown hook `int8`"),
        (&["--comm-hook", "powersgd"], "unknown hook `powersgd`"),
        (&["--comm-hook", "powersgd:0"], "powersgd's RANK `0`"),
        (
            &["--comm-hook", "powersgd:2:soon"],
            "powersgd's START `soon`",
        ),
    ] {
        let err = parse(args).unwrap_err();
        assert!(err.contains(flag), "{args:?}: {err}");
    }
}

/// `--help`'s sections, in order, each with the long names of its flags.
fn help_sections() -> Vec<(String, Vec<String>)> {
    use clap::CommandFactory;
    let help = Cli::command().render_long_help().to_string();
    let flags_part = help.split(AFTER_HELP).next().unwrap();
    let mut sections: Vec<(String, Vec<String>)> = Vec::new();
    for line in flags_part.lines() {
        let indent = line.len() - line.trim_start().len();
        if indent == 0 && line.ends_with(':') {
            sections.push((line.trim_end_matches(':').to_string(), Vec::new()));
        } else if (1..10).contains(&indent) {
            // A flag's own line ("  -h, --help", "      --seed <N>");
            // its text is indented further.
            let long = line
                .split_whitespace()
                .find_map(|word| word.strip_prefix("--"))
                .unwrap_or_else(|| panic!("no long flag in {line:?}"));
            let (_, flags) = sections.last_mut().expect("a flag before any heading");
            flags.push(long.trim_end_matches(',').to_string());
        }
    }
    sections
}

#[test]
fn help_puts_each_flag_under_exactly_one_heading() {
    use crate::run::help_heading;
    use clap::CommandFactory;
    let sections = help_sections();
    let names: Vec<&str> = sections.iter().map(|(name, _)| name.as_str()).collect();
    let mut expected = vec!["Options"];
    expected.extend(help_heading::ALL);
    assert_eq!(names, expected, "the headings of --help, in order");
    // A flag that no heading claims lands among clap's own two.
    assert_eq!(sections[0].1, ["help", "version"], "under Options");

    let shown: Vec<&str> = sections
        .iter()
        .flat_map(|(_, flags)| flags.iter().map(String::as_str))
        .collect();
    let command = Cli::command();
    for arg in command.get_arguments() {
        let long = arg.get_long().expect("every flag has a long name");
        let count = shown.iter().filter(|&&f| f == long).count();
        assert_eq!(count, 1, "--{long} appears {count} times in --help");
    }
    let under = |flag: &str| {
        let (name, _) = sections
            .iter()
            .find(|(_, flags)| flags.iter().any(|f| f == flag))
            .unwrap();
        name.clone()
    };
    for (flag, heading) in [
        ("world-size", help_heading::LAUNCHING),
        ("nnodes", help_heading::LAUNCHING),
        ("rdzv-timeout", help_heading::LAUNCHING),
        ("no-auth", help_heading::LAUNCHING),
        ("samples", help_heading::MODEL),
        ("batch-size", help_heading::TRAINING),
        ("micro-batches", help_heading::TRAINING),
        ("precision", help_heading::DEVICES),
        ("threads", help_heading::DEVICES),
        ("timeout", help_heading::COMMUNICATION),
        ("link-mbps", help_heading::COMMUNICATION),
        ("resume", help_heading::CHECKPOINTS),
        ("flight-recorder", help_heading::OBSERVABILITY),
    ] {
        assert_eq!(under(flag), heading, "--{flag}");
    }
}

/// `-h` shows each flag's first paragraph alone: one short line.
#[test]
fn short_help_is_one_short_line_per_flag() {
    use clap::CommandFactory;
    for arg in Cli::command().get_arguments() {
        let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
        let long = arg.get_long().unwrap_or_default();
        assert!(!help.is_empty(), "--{long} has no help");
        assert!(
            help.len() <= 72 && !help.contains('\n'),
            "--{long}'s first paragraph is {} characters: {help:?}",
            help.len()
        );
    }
}
