//! `cargo xtask image`: the trainer in a Debian root file system built
//! with mmdebstrap, as a directory (for `ch-run`) and a tarball (for
//! `docker import`, `podman import`, `apptainer build`), reproducibly: the
//! same Debian base, trainer and `SOURCE_DATE_EPOCH` give the same bytes.
//!
//! Two stages. The base (minbase and [`PACKAGES`]) comes from mmdebstrap,
//! which writes it reproducibly itself; it is kept under the output
//! directory with the inputs that made it, and made again only when they
//! change (or with `--fresh`). The image is then assembled from the base,
//! the trainer and the mount points, and tarred with sorted names, clamped
//! times and numeric owners, so that a second build with the same inputs
//! takes seconds and must give the same checksum.

mod sources;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::trainer_build::{
    find_on_path, profile_name, trainer, workspace_root, workspace_target_dir,
};

/// The Debian release the image is made of.
pub const SUITE: &str = "bookworm";
/// Debian packages beyond mmdebstrap's `minbase` variant, which already
/// holds all the trainer links (`ldd`: libc6, libgcc-s1). The data set makes
/// the image train without a bind mount. The GPU path's libraries (the
/// driver's libcuda, NVRTC, NCCL) come from the host at run time
/// (`ch-fromhost --nvidia`, `apptainer --nv`, `docker --gpus`).
pub const PACKAGES: &[&str] = &["dataset-fashion-mnist"];
/// Where the image holds the trainer (on PATH).
pub const TRAINER_PATH: &str = "/usr/local/bin/trainer";
/// A mount point for another data set (`--data-dir /data`).
pub const DATA_MOUNT: &str = "/data";
/// A mount point for what a run writes (checkpoints, metrics, TensorBoard):
/// a host directory bound here, the run's working directory.
pub const OUTPUT_MOUNT: &str = "/output";
/// The name of the image's directory and (with `.tar`) of its tarball.
const IMAGE_NAME: &str = "fmnist-ddp";

#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  cargo xtask image
  cargo xtask image --profile dev --no-build
  cargo xtask image --contents")]
pub struct Args {
    /// The cargo profile of the trainer to put in the image: `release` or `dev`.
    #[arg(long, default_value = "release", value_name = "PROFILE", value_parser = profile_name)]
    profile: String,
    /// Take the trainer as already built instead of running `cargo build --profile PROFILE -p trainer`.
    #[arg(long)]
    no_build: bool,
    /// Where the image's directory, its tarball and the Debian base go [default: TARGET/image].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// The Debian mirror's URI [default: the one the machine's apt sources name for bookworm].
    #[arg(long, value_name = "URI")]
    mirror: Option<String>,
    /// Build the Debian base again even if the one kept was made from the same inputs.
    #[arg(long)]
    fresh: bool,
    /// Print what the image holds (the suite, the packages, the paths) and build nothing.
    #[arg(long, conflicts_with_all = ["no_build", "fresh", "mirror", "out"])]
    contents: bool,
}

pub fn run(args: Args) -> Result<()> {
    if args.contents {
        print!("{}", contents());
        return Ok(());
    }
    let mmdebstrap = find_on_path("mmdebstrap").context(
        "`mmdebstrap` is not on PATH, and it builds the image's Debian base; \
         install it (Debian/Ubuntu: `apt-get install mmdebstrap`)",
    )?;
    let tar = find_on_path("tar")
        .context("`tar` is not on PATH; install GNU tar (`apt-get install tar`)")?;
    let root = workspace_root();
    let out = match &args.out {
        Some(dir) => std::path::absolute(dir)
            .with_context(|| format!("resolving --out {}", dir.display()))?,
        None => workspace_target_dir(&root)?.join("image"),
    };
    let epoch = source_date_epoch(&root)?;
    let mirror = match args.mirror {
        Some(uri) => uri,
        None => sources::debian_mirror(Path::new("/etc/apt"), SUITE)?,
    };
    let binary = trainer(&root, &args.profile, !args.no_build, true)?;
    std::fs::create_dir_all(&out)
        .with_context(|| format!("creating the output directory {}", out.display()))?;
    let base = Base {
        mmdebstrap: &mmdebstrap,
        dir: &out,
        mirror: &mirror,
        epoch,
    };
    let base_tar = base.ensure(args.fresh)?;
    let image = assemble(&tar, &base_tar, &binary, &out, epoch)?;
    eprintln!(
        "image: run it with `USER=$(id -un) ch-run -b HOSTDIR:{OUTPUT_MOUNT} --cd {OUTPUT_MOUNT} {} -- trainer --world-size 2`",
        image.dir.display()
    );
    println!("{}", image.dir.display());
    println!("{}", image.tarball.display());
    Ok(())
}

/// What the image holds, one `key value` a line: what the recipes
/// (`slurm/container/`) are checked against.
fn contents() -> String {
    let mut text = format!("suite {SUITE}\nvariant minbase\n");
    for package in PACKAGES {
        text.push_str(&format!("package {package}\n"));
    }
    text.push_str(&format!(
        "trainer {TRAINER_PATH}\nmount {DATA_MOUNT}\nmount {OUTPUT_MOUNT}\nworkdir {OUTPUT_MOUNT}\n"
    ));
    text
}

/// `SOURCE_DATE_EPOCH`, or the time of the checkout's last commit.
fn source_date_epoch(root: &Path) -> Result<u64> {
    let (text, from) = match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(value) => (value, "SOURCE_DATE_EPOCH"),
        Err(_) => {
            let out = Command::new("git")
                .args(["log", "-1", "--format=%ct"])
                .current_dir(root)
                .output();
            match out {
                Ok(out) if out.status.success() => (
                    String::from_utf8_lossy(&out.stdout).trim().to_owned(),
                    "the last commit's time",
                ),
                _ => bail!(
                    "no SOURCE_DATE_EPOCH and no git history to take the image's time from; \
                     set SOURCE_DATE_EPOCH=SECONDS (e.g. `export SOURCE_DATE_EPOCH=$(date +%s)`)"
                ),
            }
        }
    };
    text.parse()
        .with_context(|| format!("{from} {text:?} is not a number of seconds since 1970"))
}

/// The Debian base: mmdebstrap's tarball, kept with its inputs.
struct Base<'a> {
    mmdebstrap: &'a Path,
    dir: &'a Path,
    mirror: &'a str,
    epoch: u64,
}

impl Base<'_> {
    /// The base tarball, made unless the kept one has the same inputs.
    fn ensure(&self, fresh: bool) -> Result<PathBuf> {
        let tarball = self.dir.join("base.tar");
        let record = self.dir.join("base.inputs");
        let inputs = self.inputs();
        let kept = std::fs::read_to_string(&record).is_ok_and(|text| text == inputs);
        if kept && !fresh && tarball.is_file() {
            eprintln!(
                "image: reusing the Debian base {} (same inputs; --fresh makes it again)",
                tarball.display()
            );
            return Ok(tarball);
        }
        // A base being made is not a base made from these inputs.
        let _ = std::fs::remove_file(&record);
        let partial = self.dir.join("base.tar.partial");
        self.mmdebstrap(&partial)?;
        std::fs::rename(&partial, &tarball)
            .with_context(|| format!("renaming {} to {}", partial.display(), tarball.display()))?;
        std::fs::write(&record, inputs).with_context(|| format!("writing {}", record.display()))?;
        Ok(tarball)
    }

    fn inputs(&self) -> String {
        format!(
            "{}mirror {}\nsource-date-epoch {}\n",
            contents(),
            self.mirror,
            self.epoch
        )
    }

    fn mmdebstrap(&self, tarball: &Path) -> Result<()> {
        // The downloaded packages, kept for the next base (a cache this
        // task makes and fills itself).
        let debs = self.dir.join("debs");
        std::fs::create_dir_all(&debs).with_context(|| format!("creating {}", debs.display()))?;
        let debs = debs
            .to_str()
            .filter(|text| !text.contains(char::is_whitespace))
            .with_context(|| {
                format!(
                    "the output directory {} must be a UTF-8 path without spaces (mmdebstrap's hooks split at them); choose another --out",
                    self.dir.display()
                )
            })?;
        eprintln!(
            "image: building the Debian base ({SUITE} minbase + {}) with mmdebstrap from {}",
            PACKAGES.join(" "),
            self.mirror
        );
        let mut command = Command::new(self.mmdebstrap);
        command
            .args(["--variant=minbase", "--format=tar", "--quiet"])
            .arg(format!("--include={}", PACKAGES.join(",")))
            // dpkg's fsyncs are most of the time of a build on a disk, and
            // the base is tarred at the end anyway; the option's file goes
            // again below, so the base is the same bytes as without it.
            .arg("--dpkgopt=force-unsafe-io")
            .arg("--skip=download/empty")
            .arg("--setup-hook=mkdir -p \"$1\"/var/cache/apt/archives/")
            .arg(format!(
                "--setup-hook=sync-in {debs} /var/cache/apt/archives/"
            ))
            .arg(format!(
                "--customize-hook=sync-out /var/cache/apt/archives {debs}"
            ))
            .arg(
                "--customize-hook=rm -f \"$1\"/var/cache/apt/archives/*.deb \
                 \"$1\"/etc/dpkg/dpkg.cfg.d/99mmdebstrap",
            )
            .arg(SUITE)
            .arg(tarball)
            .arg(self.mirror)
            .env("SOURCE_DATE_EPOCH", self.epoch.to_string())
            .stdin(std::process::Stdio::null());
        // The root file system is written to mmdebstrap's temporary
        // directory: in memory where there is a tmpfs, which spares the
        // disk's syncs (a third of the time here).
        if Path::new("/dev/shm").is_dir() {
            command.env("TMPDIR", "/dev/shm");
        }
        let out = command.output().context("running mmdebstrap")?;
        if out.status.success() {
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        if let Some(package) = stderr
            .lines()
            .find_map(|l| l.split("Unable to locate package ").nth(1))
        {
            bail!(
                "package {} is not in {SUITE} at {}; check its name (`apt-cache policy {0}`) \
                 or give a mirror that has it (--mirror URI)",
                package.trim(),
                self.mirror
            );
        }
        let tail: Vec<&str> = stderr.lines().rev().take(12).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        bail!(
            "mmdebstrap failed ({}); its last lines: {}; as root it needs nothing more, \
             elsewhere see `man mmdebstrap` (--mode=unshare)",
            out.status,
            tail.join(" | ")
        )
    }
}

/// The image's directory and tarball.
struct Image {
    dir: PathBuf,
    tarball: PathBuf,
}

/// Unpacks the base, adds the trainer and the mount points, and tars the
/// whole reproducibly.
fn assemble(tar: &Path, base: &Path, binary: &Path, out: &Path, epoch: u64) -> Result<Image> {
    let dir = out.join(IMAGE_NAME);
    let tarball = out.join(format!("{IMAGE_NAME}.tar"));
    if dir.exists() {
        std::fs::remove_dir_all(&dir)
            .with_context(|| format!("removing the old image {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // The device files stay out: every runtime mounts its own /dev, and
    // only root may make them.
    run_tar(
        Command::new(tar)
            .args([
                "--extract",
                "--numeric-owner",
                "--exclude=./dev/*",
                "--file",
            ])
            .arg(base)
            .arg("--directory")
            .arg(&dir),
        "unpacking the Debian base",
    )?;
    let inside = |path: &str| dir.join(path.trim_start_matches('/'));
    let trainer_in = inside(TRAINER_PATH);
    std::fs::copy(binary, &trainer_in).with_context(|| {
        format!(
            "copying the trainer {} to {}",
            binary.display(),
            trainer_in.display()
        )
    })?;
    for mount in [DATA_MOUNT, OUTPUT_MOUNT] {
        std::fs::create_dir_all(inside(mount))
            .with_context(|| format!("creating the mount point {mount} in the image"))?;
    }
    // ch-run binds the host's over these (so that the nodes' names resolve
    // inside), and only where the image has them; minbase has neither.
    for file in ["/etc/hosts", "/etc/resolv.conf"] {
        if !inside(file).exists() {
            std::fs::write(inside(file), "")
                .with_context(|| format!("creating {file} in the image"))?;
        }
    }
    let partial = out.join(format!("{IMAGE_NAME}.tar.partial"));
    run_tar(
        Command::new(tar)
            .args([
                "--create",
                "--format=gnu",
                "--sort=name",
                "--numeric-owner",
                "--clamp-mtime",
            ])
            .arg(format!("--mtime=@{epoch}"))
            .arg("--file")
            .arg(&partial)
            .arg("--directory")
            .arg(&dir)
            .arg("."),
        "tarring the image",
    )?;
    std::fs::rename(&partial, &tarball)
        .with_context(|| format!("renaming {} to {}", partial.display(), tarball.display()))?;
    Ok(Image { dir, tarball })
}

fn run_tar(command: &mut Command, what: &str) -> Result<()> {
    let out = command
        .output()
        .with_context(|| format!("{what}: running tar"))?;
    if !out.status.success() {
        bail!(
            "{what}: tar failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}
