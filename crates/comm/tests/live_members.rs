//! `LiveMember`: a job whose membership changes forms its generations at a
//! launcher's store that frees a lost member's seat ([`Seats::Freed`]):
//! the survivors form the next ring without it, the most advanced leads, a
//! replacement takes the seat and waits until the members let it in, and
//! once the job is over a newcomer hears so.

mod common;

use std::thread;
use std::time::{Duration, Instant};

use comm::{
    CommError, Communicator, Enlisted, Generation, LiveMember, ReduceOp, Rejection, Seats,
    StoreHost, StoreServer,
};
use common::config;

const TIMEOUT: Duration = Duration::from_secs(20);

/// The member in `slot`, once the store has seen the slot's last member
/// leave.
fn member(slot: usize, port: u16) -> LiveMember {
    let since = Instant::now();
    loop {
        match LiveMember::join(&config(slot, 3, port, TIMEOUT).with_store(StoreHost::Launcher)) {
            Ok(member) => return member,
            Err(CommError::Rejected(Rejection::DuplicateRank { .. }))
                if since.elapsed() < TIMEOUT =>
            {
                thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("slot {slot} joining: {e}"),
        }
    }
}

/// Enlists `m` holding `step`, then sums its slot + 1 over the ring
/// formed: the generation, and the sum.
fn train_one_step(m: &mut LiveMember, step: Option<u64>) -> (Generation, f32) {
    let generation = match m.enlist(step, None).unwrap() {
        Enlisted::Member(g) => g,
        other => panic!("slot {} was not counted in: {other:?}", m.slot()),
    };
    let mut ring = m.ring(&generation).unwrap();
    let mut value = [m.slot() as f32 + 1.0];
    ring.all_reduce(&mut value, ReduceOp::Sum).unwrap();
    (generation, value[0])
}

/// Runs `steps[i]` on `members[i]`, all at once; the members back, with
/// what each saw.
fn together(members: Vec<(LiveMember, Option<u64>)>) -> Vec<(LiveMember, Generation, f32)> {
    let handles: Vec<_> = (members.into_iter())
        .map(|(mut m, step)| {
            thread::spawn(move || {
                let (g, sum) = train_one_step(&mut m, step);
                (m, g, sum)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn members_form_generations_as_they_are_lost_and_replaced() {
    let job = (3, TIMEOUT, None);
    let server = StoreServer::bind_for_job("127.0.0.1", 0, job, Seats::Freed).unwrap();
    let port = server.port();

    // Generation 1: every slot, from scratch.
    let first = together((0..3).map(|s| (member(s, port), None)).collect());
    for (_, g, sum) in &first {
        assert_eq!((g.number, g.world(), *sum), (1, 3, 6.0), "{g:?}");
    }
    let mut members: Vec<LiveMember> = first.into_iter().map(|(m, _, _)| m).collect();

    // Slot 2 is lost; slot 1 committed one step more than slot 0 and leads.
    drop(members.pop());
    let second = together(members.into_iter().zip([Some(5), Some(6)]).collect());
    for (_, g, sum) in &second {
        assert_eq!(g.number, 2);
        assert_eq!(g.members, vec![(1, Some(6)), (0, Some(5))]);
        assert_eq!(*sum, 3.0);
    }
    let mut members: Vec<LiveMember> = second.into_iter().map(|(m, _, _)| m).collect();

    // A replacement takes slot 2 and waits; the members see it and take it in.
    let newcomer = thread::spawn(move || train_one_step(&mut member(2, port), None));
    let since = Instant::now();
    while !members[0].newcomers_waiting().unwrap() {
        assert!(since.elapsed() < TIMEOUT, "the newcomer never showed");
        thread::sleep(Duration::from_millis(10));
    }
    let third = together(members.drain(..).map(|m| (m, Some(7))).collect());
    let (joined, sum) = newcomer.join().unwrap();
    assert_eq!(sum, 6.0);
    assert_eq!(joined.members, vec![(0, Some(7)), (1, Some(7)), (2, None)]);
    assert!(third.iter().all(|(_, g, _)| *g
        == Generation {
            rank: g.rank,
            ..joined.clone()
        }));

    // The job ends: a newcomer arriving after hears that it is over.
    let mut members: Vec<LiveMember> = third.into_iter().map(|(m, _, _)| m).collect();
    members[0].finish().unwrap();
    drop(members.pop());
    let mut late = member(1, port);
    drop(members);
    assert_eq!(late.enlist(None, None).unwrap(), Enlisted::JobOver);
}
