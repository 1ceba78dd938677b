//! The verdict on hand-made records.

use comm::flight::{Entry, GroupRecord, Kind, RankRecord, State};

use super::format::{bytes, ranks, ranks_on_nodes};
use super::{Evidence, Silence, verdict};

/// When the collectives of these records began, in microseconds.
const T0: u64 = 1_700_000_000_000_000;
const MB_4_7: usize = 4_700_000;

fn entry(seq: u64, kind: Kind, bytes: usize, state: State) -> Entry {
    let at = T0 + seq * 1_000;
    Entry {
        seq,
        kind,
        bucket: (kind == Kind::AllReduce).then_some(0),
        bytes,
        state,
        queued_us: at,
        started_us: (state != State::Queued).then_some(at + 10),
        done_us: (state == State::Done).then_some(at + 500),
    }
}

/// Gradient all-reduces `first..=last`, all done.
fn done(first: u64, last: u64) -> Vec<Entry> {
    (first..=last)
        .map(|seq| entry(seq, Kind::AllReduce, MB_4_7, State::Done))
        .collect()
}

/// `entries` of collective 42 onwards, started at T0 + seq ms.
fn with(mut entries: Vec<Entry>, more: Entry) -> Vec<Entry> {
    entries.push(more);
    entries
}

fn record(rank: usize, world: usize, waited_s: f64, groups: &[(&str, Vec<Entry>)]) -> RankRecord {
    let last = groups
        .iter()
        .flat_map(|(_, e)| e.iter().map(|e| e.started_us.unwrap_or(e.queued_us)))
        .max()
        .unwrap_or(T0);
    RankRecord {
        rank,
        world,
        host: format!("host{rank}"),
        pid: 100 + rank as u32,
        reason: "a collective timed out".into(),
        dumped_at_us: last + (waited_s * 1e6) as u64,
        groups: groups
            .iter()
            .map(|(name, entries)| GroupRecord {
                group: name.to_string(),
                rank,
                size: world,
                entries: entries.clone(),
            })
            .collect(),
    }
}

fn judge(records: &[RankRecord], nproc: usize, silent: &[(usize, Silence)]) -> String {
    let world = records.first().map_or(0, |r| r.world);
    verdict(&Evidence {
        records,
        world,
        nproc,
        silent,
    })
    .unwrap()
}

#[test]
fn a_rank_that_never_started_the_collective_is_named_with_its_last_one() {
    let stuck = entry(1042, Kind::AllReduce, MB_4_7, State::Started);
    let mut records: Vec<RankRecord> = [0, 1, 2, 3, 4, 6, 7]
        .into_iter()
        .map(|r| {
            record(
                r,
                8,
                30.0,
                &[("job", with(done(1000, 1041), stuck.clone()))],
            )
        })
        .collect();
    records.insert(5, record(5, 8, 31.0, &[("job", done(1000, 1041))]));
    assert_eq!(
        judge(&records, 2, &[]),
        "rank 5 (node 2) never started all-reduce #1042 (bucket 0, 4.7 MB); its last completed \
         collective is #1041; ranks 0-4,6,7 waited 30.0 s"
    );
    // Queued behind a collective its thread never took up.
    let queued = entry(1042, Kind::AllReduce, MB_4_7, State::Queued);
    records[5] = record(5, 8, 31.0, &[("job", with(done(1000, 1041), queued))]);
    assert!(
        judge(&records, 2, &[])
            .starts_with("rank 5 (node 2) queued but never started all-reduce #1042"),
        "{}",
        judge(&records, 2, &[])
    );
}

#[test]
fn a_rank_further_behind_is_named_with_how_far() {
    let stuck = entry(1042, Kind::AllReduce, MB_4_7, State::Started);
    let records = [
        record(
            0,
            3,
            12.5,
            &[("job", with(done(1000, 1041), stuck.clone()))],
        ),
        record(1, 3, 12.0, &[("job", with(done(1000, 1041), stuck))]),
        record(2, 3, 13.0, &[("job", done(1000, 1039))]),
    ];
    assert_eq!(
        judge(&records, 0, &[]),
        "rank 2 never started all-reduce #1042 (bucket 0, 4.7 MB); its last completed \
         collective is #1039; ranks 0,1 waited 12.5 s"
    );
}

#[test]
fn a_rank_that_wrote_nothing_is_named_from_the_others_and_the_launchers_word() {
    let stuck = entry(42, Kind::AllReduce, MB_4_7, State::Started);
    let records = [
        record(0, 3, 5.0, &[("job", with(done(1, 41), stuck.clone()))]),
        record(2, 3, 4.5, &[("job", with(done(1, 41), stuck))]),
    ];
    let expected = |why: &str| {
        format!(
            "rank 1 (node 0) {why}; ranks 0,2 waited 5.0 s for it in all-reduce #42 (bucket 0, \
             4.7 MB), after completing #41"
        )
    };
    assert_eq!(
        judge(&records, 3, &[(1, Silence::Stopped)]),
        expected("is stopped (SIGSTOP, or a debugger) and wrote no record")
    );
    let killed = [(1, Silence::Ended("killed by signal 9".into()))];
    assert_eq!(
        judge(&records, 3, &killed),
        expected("ended (killed by signal 9) and wrote no record")
    );
    // On another node, nothing more is known.
    assert_eq!(
        judge(&records, 1, &[]),
        expected("wrote no record").replace("(node 0)", "(node 1)")
    );
}

#[test]
fn mismatched_kinds_and_sizes_are_reported_first() {
    let at = |kind, bytes, state| with(done(1, 16), entry(17, kind, bytes, state));
    let records = [
        record(
            0,
            4,
            9.0,
            &[("job", at(Kind::AllReduce, MB_4_7, State::Started))],
        ),
        record(
            1,
            4,
            9.0,
            &[("job", at(Kind::AllReduce, MB_4_7, State::Started))],
        ),
        record(
            2,
            4,
            9.0,
            &[("job", at(Kind::AllReduce, MB_4_7, State::Started))],
        ),
        record(
            3,
            4,
            9.0,
            &[("job", at(Kind::Broadcast, 1_200_000, State::Started))],
        ),
    ];
    let said = judge(&records, 0, &[]);
    assert!(
        said.starts_with(
            "ranks disagree on collective #17: ranks 0-2 all-reduce (4.7 MB), rank 3 broadcast (1.2 MB)"
        ),
        "{said}"
    );
    // The same kind of another size disagrees too; an all-gather's sizes may differ.
    let sized = [
        record(
            0,
            2,
            9.0,
            &[("job", at(Kind::AllReduceF64, 16, State::Done))],
        ),
        record(
            1,
            2,
            9.0,
            &[("job", at(Kind::AllReduceF64, 24, State::Done))],
        ),
    ];
    assert!(
        judge(&sized, 0, &[])
            .contains("rank 0 all-reduce (f64) (16 B), rank 1 all-reduce (f64) (24 B)")
    );
    let gathers = [
        record(0, 2, 0.1, &[("job", at(Kind::AllGather, 16, State::Done))]),
        record(1, 2, 0.1, &[("job", at(Kind::AllGather, 24, State::Done))]),
    ];
    assert!(!judge(&gathers, 0, &[]).contains("disagree"));
}

#[test]
fn ranks_in_step_or_all_inside_one_collective_blame_no_one() {
    let running = entry(42, Kind::AllReduce, MB_4_7, State::Started);
    let healthy = [
        record(0, 2, 0.004, &[("job", with(done(1, 41), running))]),
        record(1, 2, 0.002, &[("job", done(1, 41))]),
    ];
    assert_eq!(
        judge(&healthy, 0, &[]),
        "no rank is held up: none of the 2 has waited 1 s in a collective (last completed: job #41)"
    );
    let inside = entry(42, Kind::AllReduce, MB_4_7, State::Started);
    let all_in = [
        record(0, 2, 30.0, &[("job", with(done(1, 41), inside.clone()))]),
        record(1, 2, 29.0, &[("job", with(done(1, 41), inside))]),
    ];
    assert!(
        judge(&all_in, 0, &[]).starts_with(
            "no rank is behind: ranks 0,1 waited 30.0 s inside all-reduce #42 (bucket 0, 4.7 MB), after completing #41"
        ),
        "{}",
        judge(&all_in, 0, &[])
    );
}

/// On NCCL a rank has two communicators: the verdict is on the one the
/// ranks waited in longest, named.
#[test]
fn of_several_communicators_the_longest_wait_is_judged() {
    let grads = |state| with(done(1, 9), entry(10, Kind::AllReduce, MB_4_7, state));
    let vote = |state| with(done(1, 20), entry(21, Kind::AllReduceF64, 16, state));
    let records = [
        record(
            0,
            2,
            8.0,
            &[
                ("job", vote(State::Started)),
                ("gradients", grads(State::Started)),
            ],
        ),
        record(
            1,
            2,
            1.0,
            &[("job", done(1, 20)), ("gradients", done(1, 9))],
        ),
    ];
    let said = judge(&records, 2, &[]);
    assert!(
        said.starts_with(
            "rank 1 (node 0) never started all-reduce #10 of gradients (bucket 0, 4.7 MB)"
        ),
        "{said}"
    );
    assert!(
        said.contains("last completed collective is #9 of gradients"),
        "{said}"
    );
}

#[test]
fn no_record_no_verdict() {
    let evidence = Evidence {
        records: &[],
        world: 2,
        nproc: 2,
        silent: &[(1, Silence::Unanswered)],
    };
    assert_eq!(verdict(&evidence), None);
}

#[test]
fn ranks_nodes_and_sizes_read_as_people_write_them() {
    assert_eq!(ranks(&[0, 1, 2, 3, 4, 6, 7]), "ranks 0-4,6,7");
    assert_eq!(ranks(&[5]), "rank 5");
    assert_eq!(ranks(&[3, 1]), "ranks 1,3");
    assert_eq!(ranks_on_nodes(&[5], 2), "rank 5 (node 2)");
    assert_eq!(ranks_on_nodes(&[1, 5, 9], 2), "ranks 1,5,9 (nodes 0,2,4)");
    assert_eq!(ranks_on_nodes(&[1, 5], 0), "ranks 1,5");
    assert_eq!(bytes(24), "24 B");
    assert_eq!(bytes(426_000), "426.0 kB");
    assert_eq!(bytes(4_700_000), "4.7 MB");
}
