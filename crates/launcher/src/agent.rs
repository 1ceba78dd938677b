//! One launcher's run: joins the other machines' launchers (if any),
//! starts this node's workers, supervises each attempt and restarts the
//! workers as the [`Restarts`] policy says, up to `--max-restarts` times.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use comm::launch_var::{LAUNCHER_HOSTS_STORE, TRAINER_STORE_HOST};
use comm::{AUTH_TOKEN_VAR, Auth, AuthChoice, AuthToken, Seats, StoreServer};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1, SIGUSR2};
use signal_hook::iterator::Signals;

use crate::attempt::{Failure, Graces, Outcome, POLL, local_port};
use crate::contract::progress::pipe_to_child;
use crate::contract::{PREEMPTED_EXIT_CODE, RunEnd, describe, die_with_parent};
use crate::error::{Doing, LaunchError};
use crate::flight::{Flight, Handover};
use crate::group::{LostMachine, Membership, NodeGroup, Place};
use crate::plan::{NodePlan, NodeSlot};
use crate::say::bar;
use crate::spec::{OnFailure, Restarts, WorkerSpec};
use crate::supervise::{Replacements, supervise};
use crate::workers::{Worker, stop};

/// The signals the launcher passes on to its workers.
const FORWARDED: [i32; 5] = [SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2];

/// Runs this machine's share of the job (`plan`) as `spec` says and waits
/// for all of it, restarting the workers up to `spec.max_restarts` times
/// with the arguments `restarts` gives.
///
/// After the first failure the others get `spec.failure_grace` to notice
/// (they report which peer they lost) and are then killed.
pub fn launch(
    spec: &WorkerSpec,
    plan: &NodePlan,
    restarts: &dyn Restarts,
) -> Result<RunEnd, LaunchError> {
    let mut signals =
        Signals::new(FORWARDED).doing(|| "installing the launcher's signal handlers".into())?;
    let graces = Graces {
        failure: spec.failure_grace,
        signal: spec.signal_grace,
    };
    let mut group = match &plan.master {
        Some(master) if plan.nnodes > 1 => {
            let auth = users_auth(spec)?;
            let (rdzv_id, heartbeat) = (spec.rdzv_id.as_str(), spec.heartbeat);
            // Node 0 waits for a late node's verdict; a third node's ranks
            // reporting their timeouts first would be taken at their word.
            if heartbeat >= graces.failure && plan.nnodes > 2 {
                tell!(
                    "launcher: --heartbeat-timeout {heartbeat:?} is not below --timeout {:?}: the ranks waiting on a stopped node may time out, and be blamed (and restarted), before it is found silent",
                    graces.failure
                );
            }
            Some(unless_signalled(&mut signals, || {
                NodeGroup::join(
                    plan.node_rank,
                    Membership::new(
                        (plan.min_nodes, plan.nnodes),
                        spec.max_restarts,
                        match spec.on_failure {
                            OnFailure::RestartAll => LostMachine::EndsAttempt,
                            OnFailure::Replace => LostMachine::LeavesPlace,
                        },
                    ),
                    master,
                    rdzv_id,
                    (graces.failure, spec.rdzv_timeout, heartbeat),
                    auth,
                )
            })?)
        }
        _ => None,
    };
    // Node 0's store outlives the other launchers' last look at it.
    let finish = |group: Option<&mut NodeGroup>, attempt| {
        if let Some(g) = group {
            g.finish(attempt, graces.failure + Duration::from_secs(10));
        }
    };
    // Node 0's launcher (the store's host, or the one machine) holds for
    // the job what the program asks, through every restart.
    let held = match group.as_ref().is_none_or(|g| g.node_rank == 0) {
        true => restarts.hold().map_err(LaunchError::Refused)?,
        false => Vec::new(),
    };
    let mut attempt = match group.as_mut() {
        Some(g) => g.first_attempt()?,
        None => 0,
    };
    loop {
        let (slot, master) = match group.as_mut() {
            Some(g) => match unless_signalled(&mut signals, || g.place(attempt))? {
                Place::Run {
                    attempt: placed,
                    slot,
                    master,
                } => {
                    attempt = placed;
                    (slot, master)
                }
                Place::JobOver => {
                    tell!("launcher: the job ended without this machine");
                    return Ok(RunEnd::Finished);
                }
            },
            // Without a group the plan is one machine's, node 0.
            None => {
                let slot = NodeSlot {
                    node_rank: plan.node_rank.unwrap_or(0),
                    nnodes: 1,
                };
                let master = match &plan.master {
                    Some(master) => master.clone(),
                    None => ("127.0.0.1".to_string(), local_port()?),
                };
                (slot, master)
            }
        };
        let args = match attempt {
            0 => spec.args.clone(),
            _ => restarts.args(&spec.args),
        };
        let node = (slot, group.as_mut(), attempt);
        let run = (spec, args.as_slice(), held.as_slice());
        let failure = match run_workers(run, plan, (graces, master), &mut signals, node)? {
            Outcome::Ended(end) => {
                finish(group.as_mut(), attempt);
                return Ok(ended(end, restarts));
            }
            Outcome::Failed(failure) => failure,
        };
        if attempt == spec.max_restarts || !failure.restartable {
            finish(group.as_mut(), attempt);
            let spent = match attempt {
                _ if attempt < spec.max_restarts => {
                    " (not restarted: a restart would meet the same cause)".to_string()
                }
                0 => String::new(),
                _ => format!(" (after {attempt} restart(s))"),
            };
            refuse!(WorkersFailed, "{}{spent}", failure.message);
        }
        attempt += 1;
        tell!(
            "launcher: {}; restart {attempt} of {} from {}",
            failure.first,
            spec.max_restarts,
            restarts.continues_from()
        );
    }
}

/// Says how the workers ended when that was not plain success.
fn ended(end: RunEnd, restarts: &dyn Restarts) -> RunEnd {
    match end {
        RunEnd::Finished => {}
        RunEnd::Preempted => tell!(
            "launcher: the workers stopped on a preemption request (exit code {PREEMPTED_EXIT_CODE}); {}",
            restarts.after_preemption()
        ),
        RunEnd::Signalled(signal) => tell!(
            "launcher: stopped the workers on {}; exiting with {}",
            describe(signal),
            end.exit_code()
        ),
    }
    end
}

/// Runs `wait`, a wait on the other nodes while no worker of this node
/// runs, watching the launcher's signals meanwhile: one ends the launcher
/// at once, nothing being lost yet (75 for SIGTERM/SIGUSR1, the code on
/// which batch scripts requeue; 128 + signal otherwise), where the wait
/// itself would hold it for up to --rdzv-timeout.
fn unless_signalled<T: Send>(signals: &mut Signals, wait: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| {
        let waiting = scope.spawn(wait);
        loop {
            if waiting.is_finished() {
                return waiting
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            }
            if let Some(signal) = signals.pending().next() {
                let code = RunEnd::stopped_early_by(signal).exit_code();
                tell!(
                    "launcher: {} while waiting for the other nodes (no workers running): exiting with {code}",
                    describe(signal)
                );
                std::process::exit(code);
            }
            std::thread::sleep(POLL);
        }
    })
}

/// The job secret this launcher makes for its workers: a fresh one per
/// attempt when it starts the whole job and the user gave none. Launchers
/// on several machines would each make another, so there the user's
/// (`TRAINER_AUTH_TOKEN`, `--auth-token-file`, passed on as they are) is the
/// job's, or none (`--no-auth`, which the workers get too).
fn fresh_token(spec: &WorkerSpec, plan: &NodePlan) -> Result<Option<AuthToken>, LaunchError> {
    let given = match &spec.auth {
        AuthChoice::FromEnv => std::env::var_os(AUTH_TOKEN_VAR).is_some(),
        AuthChoice::File(_) | AuthChoice::NoAuth => true,
    };
    if given || plan.nnodes > 1 {
        return Ok(None);
    }
    Ok(Some(
        AuthToken::generate().doing(|| "generating the job's auth token".into())?,
    ))
}

/// The job's token as the user gave it (`--auth-token-file`, else
/// `TRAINER_AUTH_TOKEN`), or why none (`--no-auth`, or none given).
fn users_auth(spec: &WorkerSpec) -> Result<Auth, LaunchError> {
    (spec.auth.resolve()).doing(|| "reading the job's auth token".into())
}

/// The workers' store at `master`, for `world` workers, proving the job's
/// token as they will: this attempt's fresh `token`, else the user's
/// (`--auth-token-file`, `TRAINER_AUTH_TOKEN`), none with `--no-auth`.
fn host_store(
    spec: &WorkerSpec,
    (addr, port): &(String, u16),
    world: usize,
    token: Option<&AuthToken>,
) -> Result<StoreServer, LaunchError> {
    let auth = match token {
        Some(token) => Some(token.clone()),
        None => users_auth(spec)?.token().cloned(),
    };
    // A live job's replacements take their lost members' seats.
    let seats = match spec.on_failure {
        OnFailure::RestartAll => Seats::Kept,
        OnFailure::Replace => Seats::Freed,
    };
    let job = (world, spec.failure_grace, auth);
    StoreServer::bind_for_job(addr, *port, job, seats).doing(|| {
        format!("hosting the workers' store at {addr}:{port} (MASTER_PORT; --master-port)")
    })
}

/// One attempt: starts the workers of `spec`, with `args` and the
/// variables of what this launcher `held`, as the machine in `slot`, their
/// store at `master`, and supervises them.
fn run_workers(
    (spec, args, held): (&WorkerSpec, &[OsString], &[(OsString, OsString)]),
    plan: &NodePlan,
    (graces, master): (Graces, (String, u16)),
    signals: &mut Signals,
    (slot, mut group, attempt): (NodeSlot, Option<&mut NodeGroup>, u32),
) -> Result<Outcome, LaunchError> {
    let node_rank = slot.node_rank;
    let token = fresh_token(spec, plan)?;
    let world = slot.nnodes * plan.nproc;
    // Node 0's launcher hosts the workers' store, as torchrun's agent does:
    // it outlives every worker, rank 0 included. It lives for the attempt.
    let _store = match node_rank {
        0 => Some(host_store(spec, &master, world, token.as_ref())?),
        _ => None,
    };
    let flight = (spec.flight_recorder.as_deref())
        .map(|dir| Flight::begin(dir, world, plan.nproc, node_rank));
    let mut starter = Starter {
        run: (spec, args, held),
        plan,
        slot,
        master: &master,
        token: token.as_ref(),
        group: 0,
    };
    let mut workers: Vec<Worker> = Vec::with_capacity(plan.nproc);
    for local_rank in 0..plan.nproc {
        match starter.start(local_rank) {
            Ok(worker) => workers.push(worker),
            Err(e) => {
                stop(&mut workers);
                return Err(e);
            }
        }
    }
    let mut start = |local_rank| starter.start(local_rank);
    let replacements = (spec.on_failure == OnFailure::Replace).then_some(Replacements {
        start: &mut start,
        left: spec.max_restarts,
        max: spec.max_restarts,
    });
    let outcome = supervise(
        &mut workers,
        (graces, replacements),
        signals,
        group.as_deref_mut().map(|g| (g, attempt)),
        flight.as_ref(),
    );
    if let (Outcome::Failed(failure), Some(flight)) = (&outcome, &flight) {
        flight_verdict(flight, failure, (node_rank, group, attempt), graces.failure);
    }
    Ok(outcome)
}

/// What starting one of an attempt's workers takes.
struct Starter<'a> {
    run: (&'a WorkerSpec, &'a [OsString], &'a [(OsString, OsString)]),
    plan: &'a NodePlan,
    slot: NodeSlot,
    master: &'a (String, u16),
    token: Option<&'a AuthToken>,
    /// The process group the workers share (0: the first one leads a new one).
    group: i32,
}

impl Starter<'_> {
    /// Starts the worker at `local_rank` of this machine, with its output
    /// relayed and, for rank 0, its progress drawn.
    fn start(&mut self, local_rank: usize) -> Result<Worker, LaunchError> {
        let (spec, args, held) = self.run;
        let rank = self.slot.node_rank * self.plan.nproc + local_rank;
        let exe = &spec.exe;
        let mut command = Command::new(exe);
        die_with_parent(&mut command);
        // Rank 0's progress, for the bar on this launcher's terminal.
        let progress = match rank == 0 && bar::available() {
            true => {
                Some(pipe_to_child(&mut command).doing(|| "making rank 0's progress pipe".into())?)
            }
            false => None,
        };
        let spawned = command
            .process_group(self.group)
            .args(args)
            .envs(self.plan.worker_env(self.slot, local_rank, self.master))
            .envs(self.token.iter().map(|t| (AUTH_TOKEN_VAR, t.to_hex())))
            .envs(held.iter().cloned())
            .env(TRAINER_STORE_HOST, LAUNCHER_HOSTS_STORE)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        let child = spawned.doing(|| format!("starting worker rank {rank} ({})", exe.display()))?;
        // The first worker leads a new process group; the others join it.
        if self.group == 0 {
            self.group = child.id() as i32;
        }
        let (addr, port) = self.master;
        tell!(
            "launcher: started rank {rank} (pid {}), master {addr}:{port}",
            child.id()
        );
        let mut worker = Worker::attach(rank, child);
        if let Some((reader, writer)) = progress {
            // The child holds its own copy: the pipe ends with it.
            drop(writer);
            worker.draw_progress(reader);
        }
        Ok(worker)
    }
}

/// After a failed attempt, node 0 says the flight recorder's verdict (the
/// other nodes' parts waited for up to `wait` and a little more, the time
/// they give their own workers); the other nodes hand it their part.
fn flight_verdict(
    flight: &Flight,
    failure: &Failure,
    (node_rank, group, attempt): (usize, Option<&mut NodeGroup>, u32),
    wait: Duration,
) {
    match group {
        Some(g) if node_rank != 0 => {
            g.hand_over_flight(attempt, &flight.handover(&failure.silent).encode());
        }
        group => {
            let parts = group.map_or_else(Vec::new, |g| {
                g.flight_handovers(attempt, wait + Duration::from_secs(10))
            });
            let parts = parts.iter().map(|p| Handover::decode(p)).collect();
            tell!(
                "launcher: flight recorder: {}",
                flight.conclude(&failure.silent, parts)
            );
        }
    }
}
