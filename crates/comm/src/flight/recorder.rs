//! [`Recorder`]: one communicator's last [`CAPACITY`] collectives in a ring
//! of atomics. The thread that queues a collective and the one that runs it
//! (or watches its CUDA events) write without a lock and without
//! allocating; a dump reads the ring at any moment from another thread,
//! skipping a slot it finds being rewritten (a seqlock per slot).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering, fence};
use std::time::{Instant, SystemTime};

use super::record::{Entry, GroupRecord, Kind, State, unix_micros};

/// How many collectives a recorder keeps: the newest, per communicator.
pub const CAPACITY: usize = 256;

/// One collective. Times are microseconds since the recorder's start plus
/// one (0: not yet); `seq` is 0 while the slot is being rewritten.
#[derive(Default)]
struct Slot {
    seq: AtomicU64,
    /// The kind (low 8 bits) and the bucket plus one (0: none) above it.
    what: AtomicU64,
    bytes: AtomicU64,
    queued: AtomicU64,
    started: AtomicU64,
    done: AtomicU64,
}

/// The flight recorder of one communicator (a group: the job's ring, the
/// NCCL gradients, a pipeline's link): sequence numbers count the
/// collectives queued on it from 1, alike on every member, since every
/// member queues the same collectives in the same order.
pub struct Recorder {
    group: String,
    rank: usize,
    size: usize,
    base: Instant,
    base_unix_us: u64,
    last_seq: AtomicU64,
    slots: Box<[Slot]>,
}

impl Recorder {
    /// An empty recorder for `rank` of the group `group` of `size` ranks.
    pub fn new(group: impl Into<String>, rank: usize, size: usize) -> Arc<Self> {
        let base_unix_us = unix_micros(SystemTime::now());
        Arc::new(Self {
            group: group.into(),
            rank,
            size,
            base: Instant::now(),
            base_unix_us,
            last_seq: AtomicU64::new(0),
            slots: (0..CAPACITY).map(|_| Slot::default()).collect(),
        })
    }

    pub fn group(&self) -> &str {
        &self.group
    }

    fn now(&self) -> u64 {
        self.base.elapsed().as_micros() as u64 + 1
    }

    fn slot(&self, seq: u64) -> &Slot {
        &self.slots[(seq as usize - 1) % CAPACITY]
    }

    /// Records a collective queued now and returns its sequence number.
    /// Called in program order by the thread that queues collectives.
    pub fn queue(&self, kind: Kind, bucket: Option<usize>, bytes: usize) -> u64 {
        let seq = self.last_seq.fetch_add(1, Ordering::Relaxed) + 1;
        let slot = self.slot(seq);
        slot.seq.store(0, Ordering::Relaxed);
        fence(Ordering::Release);
        let bucket = bucket.map_or(0, |b| b as u64 + 1);
        slot.what
            .store(kind as u64 | bucket << 8, Ordering::Relaxed);
        slot.bytes.store(bytes as u64, Ordering::Relaxed);
        slot.queued.store(self.now(), Ordering::Relaxed);
        slot.started.store(0, Ordering::Relaxed);
        slot.done.store(0, Ordering::Relaxed);
        slot.seq.store(seq, Ordering::Release);
        seq
    }

    /// Collective `seq` has started (its transfer began, or the GPU stream
    /// reached it); a no-op once it left the ring.
    pub fn start(&self, seq: u64) {
        self.stamp(seq, |slot| &slot.started);
    }

    /// Collective `seq` has completed (and so also started).
    pub fn finish(&self, seq: u64) {
        self.stamp(seq, |slot| &slot.started);
        self.stamp(seq, |slot| &slot.done);
    }

    fn stamp(&self, seq: u64, field: impl Fn(&Slot) -> &AtomicU64) {
        if seq == 0 {
            return;
        }
        let slot = self.slot(seq);
        if slot.seq.load(Ordering::Acquire) == seq {
            let now = self.now();
            // Only the first stamp counts: `finish` after `start` keeps
            // the start's time.
            let _ = field(slot).compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// The collectives the ring holds, oldest first.
    pub fn snapshot(&self) -> GroupRecord {
        let mut entries: Vec<Entry> = self.slots.iter().filter_map(|s| self.read(s)).collect();
        entries.sort_by_key(|e| e.seq);
        GroupRecord {
            group: self.group.clone(),
            rank: self.rank,
            size: self.size,
            entries,
        }
    }

    /// One slot, unless it is empty or was rewritten while read.
    fn read(&self, slot: &Slot) -> Option<Entry> {
        let seq = slot.seq.load(Ordering::Acquire);
        let what = slot.what.load(Ordering::Relaxed);
        let bytes = slot.bytes.load(Ordering::Relaxed);
        let queued = slot.queued.load(Ordering::Relaxed);
        let started = slot.started.load(Ordering::Relaxed);
        let done = slot.done.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        if seq == 0 || slot.seq.load(Ordering::Relaxed) != seq {
            return None;
        }
        let at = |t: u64| (t > 0).then(|| self.base_unix_us + t - 1);
        let state = match (started, done) {
            (_, 1..) => State::Done,
            (1.., _) => State::Started,
            _ => State::Queued,
        };
        Some(Entry {
            seq,
            kind: Kind::from_code(what as u8)?,
            bucket: (what >> 8).checked_sub(1).map(|b| b as usize),
            bytes: bytes as usize,
            state,
            queued_us: at(queued)?,
            started_us: at(started),
            done_us: at(done),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collectives_go_from_queued_to_started_to_done() {
        let r = Recorder::new("job", 1, 3);
        let a = r.queue(Kind::AllReduce, Some(2), 4_700_000);
        let b = r.queue(Kind::AllReduceF64, None, 24);
        let c = r.queue(Kind::Broadcast, None, 40);
        assert_eq!((a, b, c), (1, 2, 3));
        r.start(a);
        r.finish(a);
        r.start(b);
        let got = r.snapshot();
        assert_eq!((got.group.as_str(), got.rank, got.size), ("job", 1, 3));
        let states: Vec<_> = got.entries.iter().map(|e| (e.seq, e.state)).collect();
        assert_eq!(
            states,
            [(1, State::Done), (2, State::Started), (3, State::Queued)]
        );
        let first = &got.entries[0];
        assert_eq!(
            (first.kind, first.bucket, first.bytes),
            (Kind::AllReduce, Some(2), 4_700_000)
        );
        assert!(first.queued_us <= first.started_us.unwrap());
        assert!(first.started_us <= first.done_us);
        assert_eq!(got.entries[1].bucket, None);
        assert_eq!(got.entries[2].started_us, None);
    }

    #[test]
    fn the_ring_keeps_the_newest_collectives() {
        let r = Recorder::new("gradients", 0, 2);
        for _ in 0..CAPACITY + 10 {
            let seq = r.queue(Kind::AllReduce, Some(0), 8);
            r.finish(seq);
        }
        let seqs: Vec<u64> = r.snapshot().entries.iter().map(|e| e.seq).collect();
        let expected: Vec<u64> = (11..=(CAPACITY as u64 + 10)).collect();
        assert_eq!(seqs, expected);
        // A collective that left the ring is not stamped into its successor.
        r.start(5);
        assert_eq!(r.snapshot().entries[0].state, State::Done);
    }

    #[test]
    fn a_finish_without_a_start_marks_both() {
        let r = Recorder::new("job", 0, 2);
        let seq = r.queue(Kind::Barrier, None, 4);
        r.finish(seq);
        let e = &r.snapshot().entries[0];
        assert_eq!(e.state, State::Done);
        assert!(e.started_us.is_some());
    }

    /// A dump from another thread while collectives stream through sees
    /// only whole entries, in order, each consistent with itself.
    #[test]
    fn a_concurrent_snapshot_sees_whole_entries() {
        let r = Recorder::new("job", 0, 2);
        let writer = {
            let r = r.clone();
            std::thread::spawn(move || {
                for i in 0..20_000usize {
                    let seq = r.queue(Kind::AllReduce, Some(i % 7), i % 7 * 100);
                    r.finish(seq);
                }
            })
        };
        while !writer.is_finished() {
            let got = r.snapshot();
            assert!(got.entries.windows(2).all(|w| w[0].seq < w[1].seq));
            for e in &got.entries {
                assert_eq!(e.bytes, e.bucket.unwrap() * 100, "{e:?}");
            }
        }
        writer.join().unwrap();
    }
}
