//! `--backend`: NCCL or the TCP ring. Every rank states what it has (a GPU,
//! which one, whether libnccl loads); the statements are exchanged over the
//! TCP communicator, so every rank applies the same rule to the same facts
//! and all of them choose alike.

use comm::{CommError, Communicator, ReduceOp};

use super::BackendChoice;

/// The transport gradients take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Nccl,
    Tcp,
}

/// What one rank brings to the choice.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct RankDevice {
    /// The UUID of the GPU the rank trains on; `None` on the CPU.
    pub gpu: Option<[u8; 16]>,
    /// Whether the rank can load libnccl (only asked of GPU ranks).
    pub nccl_loadable: bool,
}

/// The choice, and for `auto` falling back to TCP while some rank has a
/// GPU, why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub transport: Transport,
    pub note: Option<String>,
}

/// Applies the rule: NCCL needs every rank on a GPU of its own (NCCL
/// refuses two ranks on one GPU) with libnccl loadable.
pub fn choose(requested: BackendChoice, ranks: &[RankDevice]) -> Result<Decision, String> {
    let tcp = |note| Decision {
        transport: Transport::Tcp,
        note,
    };
    match (requested, why_not_nccl(ranks)) {
        (BackendChoice::Tcp, _) => Ok(tcp(None)),
        (_, None) => Ok(Decision {
            transport: Transport::Nccl,
            note: None,
        }),
        (BackendChoice::Nccl, Some(why)) => Err(format!(
            "--backend nccl needs every rank on a GPU of its own with libnccl, but {why}; \
             use --backend tcp (or auto)"
        )),
        (BackendChoice::Auto, Some(why)) => {
            let some_gpu = ranks.iter().any(|r| r.gpu.is_some());
            Ok(tcp(some_gpu.then(|| {
                format!("gradients travel over the TCP transport, not NCCL: {why}")
            })))
        }
    }
}

/// The first reason NCCL cannot serve these ranks.
fn why_not_nccl(ranks: &[RankDevice]) -> Option<String> {
    let which = |f: &dyn Fn(&RankDevice) -> bool| -> Vec<usize> {
        ranks
            .iter()
            .enumerate()
            .filter(|(_, r)| f(r))
            .map(|(i, _)| i)
            .collect()
    };
    let cpu = which(&|r| r.gpu.is_none());
    if !cpu.is_empty() {
        return Some(format!("rank(s) {cpu:?} train on the CPU"));
    }
    for (i, r) in ranks.iter().enumerate() {
        let sharing = which(&|o| o.gpu == r.gpu);
        if sharing.len() > 1 && sharing[0] == i {
            return Some(format!(
                "ranks {sharing:?} share one GPU (NCCL refuses two ranks on one GPU)"
            ));
        }
    }
    let no_lib = which(&|r| !r.nccl_loadable);
    (!no_lib.is_empty()).then(|| format!("rank(s) {no_lib:?} cannot load libnccl"))
}

/// Values per rank in the exchange: has-GPU, libnccl, four UUID words.
const SLOTS: usize = 6;

/// Every rank's [`RankDevice`], in rank order; `mine` is this rank's.
/// One exact f64 all-reduce: each rank fills its own slots, zeros elsewhere.
pub fn exchange(
    comm: &mut dyn Communicator,
    mine: &RankDevice,
) -> Result<Vec<RankDevice>, CommError> {
    let (rank, world_size) = (comm.rank(), comm.world_size());
    let mut all = vec![0.0f64; SLOTS * world_size];
    encode(mine, &mut all[SLOTS * rank..SLOTS * (rank + 1)]);
    comm.all_reduce_f64(&mut all, ReduceOp::Sum)?;
    Ok(all.chunks_exact(SLOTS).map(decode).collect())
}

fn encode(device: &RankDevice, slots: &mut [f64]) {
    slots[0] = f64::from(u8::from(device.gpu.is_some()));
    slots[1] = f64::from(u8::from(device.nccl_loadable));
    let uuid = device.gpu.unwrap_or_default();
    for (slot, word) in slots[2..].iter_mut().zip(uuid.chunks_exact(4)) {
        *slot = f64::from(u32::from_le_bytes([word[0], word[1], word[2], word[3]]));
    }
}

fn decode(slots: &[f64]) -> RankDevice {
    let mut uuid = [0u8; 16];
    for (word, slot) in uuid.chunks_exact_mut(4).zip(&slots[2..]) {
        // Exact: each slot holds one rank's u32 plus zeros.
        word.copy_from_slice(&(*slot as u32).to_le_bytes());
    }
    RankDevice {
        gpu: (slots[0] == 1.0).then_some(uuid),
        nccl_loadable: slots[1] == 1.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use comm::{CommConfig, TcpCommunicator};

    fn gpu(id: u8) -> RankDevice {
        RankDevice {
            gpu: Some([id; 16]),
            nccl_loadable: true,
        }
    }

    const CPU: RankDevice = RankDevice {
        gpu: None,
        nccl_loadable: false,
    };

    #[test]
    fn auto_picks_nccl_only_when_every_rank_has_a_gpu_of_its_own() {
        let own = [gpu(1), gpu(2), gpu(3)];
        assert_eq!(
            choose(BackendChoice::Auto, &own).unwrap().transport,
            Transport::Nccl
        );
        assert_eq!(
            choose(BackendChoice::Nccl, &own).unwrap().transport,
            Transport::Nccl
        );
        assert_eq!(
            choose(BackendChoice::Tcp, &own).unwrap(),
            Decision {
                transport: Transport::Tcp,
                note: None
            }
        );
    }

    #[test]
    fn ranks_sharing_a_gpu_fall_back_to_tcp_or_fail_naming_them() {
        let shared = [gpu(1), gpu(2), gpu(1)];
        let auto = choose(BackendChoice::Auto, &shared).unwrap();
        assert_eq!(auto.transport, Transport::Tcp);
        assert!(auto.note.unwrap().contains("ranks [0, 2] share one GPU"));
        let err = choose(BackendChoice::Nccl, &shared).unwrap_err();
        assert!(err.contains("ranks [0, 2] share one GPU"), "{err}");
        assert!(err.contains("--backend tcp"), "{err}");
    }

    #[test]
    fn cpu_ranks_and_missing_libraries_rule_out_nccl() {
        let mixed = [gpu(1), CPU];
        let err = choose(BackendChoice::Nccl, &mixed).unwrap_err();
        assert!(err.contains("rank(s) [1] train on the CPU"), "{err}");
        // All on the CPU: TCP without a note (nothing surprising about it).
        assert_eq!(
            choose(BackendChoice::Auto, &[CPU, CPU]).unwrap(),
            Decision {
                transport: Transport::Tcp,
                note: None
            }
        );
        let no_lib = [
            gpu(1),
            RankDevice {
                nccl_loadable: false,
                ..gpu(2)
            },
        ];
        let auto = choose(BackendChoice::Auto, &no_lib).unwrap();
        assert_eq!(auto.transport, Transport::Tcp);
        assert!(
            auto.note
                .unwrap()
                .contains("rank(s) [1] cannot load libnccl")
        );
        assert!(choose(BackendChoice::Nccl, &no_lib).is_err());
    }

    #[test]
    fn every_rank_learns_every_ranks_device_and_chooses_alike() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let devices = [gpu(7), CPU, gpu(7)];
        let seen: Vec<_> = std::thread::scope(|s| {
            let ranks: Vec<_> = (0..devices.len())
                .map(|rank| {
                    let mine = devices[rank].clone();
                    s.spawn(move || {
                        let config = CommConfig::new(rank, 3, "127.0.0.1", port)
                            .with_timeout(std::time::Duration::from_secs(20));
                        let mut comm = TcpCommunicator::connect(&config).unwrap();
                        exchange(&mut comm, &mine).unwrap()
                    })
                })
                .collect();
            ranks.into_iter().map(|r| r.join().unwrap()).collect()
        });
        for got in &seen {
            assert_eq!(got, &devices.to_vec());
            let auto = choose(BackendChoice::Auto, got).unwrap();
            assert_eq!(auto.transport, Transport::Tcp);
            assert!(auto.note.unwrap().contains("rank(s) [1] train on the CPU"));
        }
    }

    #[test]
    fn a_rank_device_survives_the_exchange_encoding() {
        let mut uuid = [0u8; 16];
        uuid.iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = 0xF0 ^ (i as u8 * 37));
        for device in [
            RankDevice {
                gpu: Some(uuid),
                nccl_loadable: true,
            },
            RankDevice {
                gpu: Some([0xFF; 16]),
                nccl_loadable: false,
            },
            CPU,
        ] {
            // World size 1: no store, no sockets, so any address will do.
            let mut alone = TcpCommunicator::connect(&CommConfig::new(0, 1, "", 0)).unwrap();
            let got = exchange(&mut alone, &device).unwrap();
            assert_eq!(got, vec![device]);
        }
    }
}
