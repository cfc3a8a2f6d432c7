//! Unit tests of the orchestrator: dependencies, stalls, scopes, deadlocks.

use super::*;

const CUBE: KernelRef = KernelRef {
    id: 2,
    kind: CoreKind::Cube,
};
const VEC: KernelRef = KernelRef {
    id: 1,
    kind: CoreKind::Vector,
};

fn region(start: u32, len: u32) -> Region {
    Region {
        offset: [start, 0, 0, 0],
        extent: [len, 1, 1, 1],
    }
}

fn read(tensor: u32, start: u32, len: u32) -> TaskArg {
    TaskArg {
        tensor,
        region: region(start, len),
        access: Access::READ,
    }
}

fn write(tensor: u32, start: u32, len: u32) -> TaskArg {
    TaskArg {
        tensor,
        region: region(start, len),
        access: Access::WRITE,
    }
}

type Small = Orchestrator<4, 16, 16>;

/// Edges from live producers: in the DepList pool, and each producer's
/// first one in its slot.
fn edges<const T: usize, const M: usize, const D: usize>(o: &Orchestrator<T, M, D>) -> usize {
    let first = (o.head..o.next).filter(|&id| o.slot(id).consumer != NO_SLOT);
    o.deps.used() + first.count()
}

fn submit<const T: usize, const M: usize, const D: usize>(
    o: &mut Orchestrator<T, M, D>,
    args: &[TaskArg],
) -> Result<TaskId, SubmitError> {
    o.submit(0, VEC, args, 0, &[], 0)
}

/// Runs the oldest ready vector task to completion.
fn run_one<const T: usize, const M: usize, const D: usize>(
    o: &mut Orchestrator<T, M, D>,
) -> TaskId {
    let t = o.pop_ready(CoreKind::Vector).expect("a ready task");
    o.complete(t.id).unwrap();
    t.id
}

#[test]
fn raw_waw_and_war_are_all_tracked() {
    let mut o = Orchestrator::<16, 64, 64>::new(0);
    let w0 = submit(&mut o, &[write(7, 0, 4)]).unwrap();
    let r1 = submit(&mut o, &[read(7, 2, 4)]).unwrap(); // RAW on w0
    let w2 = submit(&mut o, &[write(7, 5, 4)]).unwrap(); // WAR on r1 (5 in 2..6); no overlap with w0
    let other = submit(&mut o, &[write(8, 0, 4)]).unwrap(); // another tensor: independent
    assert_eq!(
        o.ready_count(CoreKind::Vector),
        2,
        "w0 and the other tensor's writer"
    );
    assert_eq!(run_one(&mut o), w0);
    assert_eq!(run_one(&mut o), other);
    assert_eq!(run_one(&mut o), r1, "r1 was released by w0");
    assert_eq!(
        o.ready_count(CoreKind::Vector),
        1,
        "w2 waited for the reader (WAR)"
    );
    assert_eq!(run_one(&mut o), w2);
    let w3 = submit(&mut o, &[write(7, 0, 1)]).unwrap();
    let w4 = submit(&mut o, &[write(7, 0, 2)]).unwrap(); // WAW on w3
    assert_eq!(run_one(&mut o), w3);
    assert_eq!(run_one(&mut o), w4);
    assert!(o.is_drained());
}

#[test]
fn reads_do_not_order_reads() {
    let mut o = Orchestrator::<16, 64, 64>::new(0);
    for _ in 0..5 {
        submit(&mut o, &[read(1, 0, 8)]).unwrap();
    }
    assert_eq!(o.ready_count(CoreKind::Vector), 5);
}

/// Tasks retire oldest first whatever order they complete in: a task that
/// completes before an older one waits for it, and one a scope holds
/// retires when the scope ends.
#[test]
fn tasks_retire_in_order_whatever_order_they_complete_in() {
    let mut o = Orchestrator::<16, 64, 64>::new(0);
    let ids: Vec<TaskId> = (0..4)
        .map(|i| submit(&mut o, &[write(i, 0, 1)]).unwrap())
        .collect();
    let ready: Vec<TaskId> = (0..4)
        .map(|_| o.pop_ready(CoreKind::Vector).unwrap().id)
        .collect();
    assert_eq!(ready, ids);
    o.complete(ids[2]).unwrap();
    o.complete(ids[1]).unwrap();
    assert_eq!(o.in_flight(), 4, "the oldest is still running");
    o.complete(ids[0]).unwrap();
    assert_eq!(o.in_flight(), 1, "the three oldest retire together");
    o.complete(ids[3]).unwrap();
    assert!(o.is_drained());

    // A scope holds its tasks past their completion.
    o.scope_begin("held").unwrap();
    let held = submit(&mut o, &[write(9, 0, 1)]).unwrap();
    o.scope_end().unwrap();
    let after = submit(&mut o, &[write(8, 0, 1)]).unwrap();
    o.scope_begin("again").unwrap();
    let inner = submit(&mut o, &[write(7, 0, 1)]).unwrap();
    for _ in 0..3 {
        let t = o.pop_ready(CoreKind::Vector).unwrap().id;
        assert!([held, after, inner].contains(&t));
    }
    o.complete(inner).unwrap();
    o.complete(after).unwrap();
    assert_eq!(o.in_flight(), 3, "the oldest is still running");
    o.complete(held).unwrap();
    assert_eq!(o.in_flight(), 1, "the scope still open holds its task");
    o.scope_end().unwrap();
    assert!(o.is_drained());

    // Completed in a batch: in flight until the batch retires, and
    // completed once only.
    let ids: Vec<TaskId> = (0..3)
        .map(|i| submit(&mut o, &[write(i, 0, 1)]).unwrap())
        .collect();
    while let Some(t) = o.pop_ready(CoreKind::Vector) {
        o.complete_unretired(t.id).unwrap();
    }
    assert_eq!(o.in_flight(), 3);
    assert_eq!(
        o.complete_unretired(ids[1]),
        Err(UsageError::NotRunning { id: ids[1] })
    );
    o.retire_completed();
    assert!(o.is_drained());
}

#[test]
fn covered_entries_are_pruned() {
    let mut o = Orchestrator::<1024, 1024, 1024>::new(0);
    // Without pruning, the 1000th writer of one region would scan 999 live
    // writers (and depend on each of them).
    for _ in 0..1000 {
        submit(&mut o, &[write(3, 0, 16)]).unwrap();
    }
    let region = write(3, 0, 16).region;
    assert!(
        o.tmap.chain_len(3, &region) <= 2,
        "each write covers the previous one: {} entries to scan",
        o.tmap.chain_len(3, &region)
    );
    assert_eq!(edges(&o), 999, "one edge per task, to its predecessor");
    assert_eq!(o.ready_count(CoreKind::Vector), 1, "still a chain");
    let mut order = Vec::new();
    while !o.is_drained() {
        order.push(run_one(&mut o));
    }
    assert_eq!(order, (0..1000).collect::<Vec<_>>());
    assert_eq!(o.tmap.used(), 0, "retirement frees the rest");
}

/// The high-water marks are taken when use shrinks and when they are
/// read (`Orchestrator::use_now`), not at every submission: they must
/// still be the most use any submission left, as the test sees it after
/// each one.
#[test]
fn high_water_marks_are_the_most_use_after_any_submission() {
    let mut o = Orchestrator::<16, 24, 8>::new(0);
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut random = move |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    let mut most = [0u64; 3];
    for step in 0..4000 {
        if random(3) == 0 {
            // Complete one to three ready tasks, of either kind.
            for _ in 0..=random(3) {
                let kind = if random(2) == 0 {
                    CoreKind::Vector
                } else {
                    CoreKind::Cube
                };
                if let Some(t) = o.pop_ready(kind) {
                    if random(2) == 0 {
                        o.complete(t.id).unwrap();
                    } else {
                        o.complete_unretired(t.id).unwrap();
                    }
                }
            }
            if random(2) == 0 {
                o.retire_completed();
            }
        } else {
            let args: Vec<TaskArg> = (0..=random(3))
                .map(|_| {
                    let (tensor, start) = (random(3) as u32, random(12) as u32);
                    let len = 1 + random(4) as u32;
                    if random(2) == 0 {
                        read(tensor, start, len)
                    } else {
                        write(tensor, start, len)
                    }
                })
                .collect();
            let kernel = if random(2) == 0 { VEC } else { CUBE };
            if o.submit(0, kernel, &args, 0, &[], step).is_ok() {
                let now = [o.in_flight(), o.tmap.used() as u64, o.deps.used() as u64];
                for (m, n) in most.iter_mut().zip(now) {
                    *m = (*m).max(n);
                }
            }
        }
        if step % 97 == 0 || step == 3999 {
            let stats = o.stats();
            let marks = [
                StallReason::TaskRingFull,
                StallReason::TensorMapPoolFull,
                StallReason::DepListPoolFull,
            ]
            .map(|r| stats.of(r).high_water);
            assert_eq!(marks, most, "after step {step}");
        }
    }
    assert_eq!(most[0], 16, "the run filled the window");
    assert!(most[2] > 0, "the run took DepList nodes");
}

#[test]
fn each_resource_stalls_and_recovers() {
    // Task ring: 4 slots.
    let mut o = Small::new(0);
    for i in 0..4 {
        submit(&mut o, &[write(i, 0, 1)]).unwrap();
    }
    assert_eq!(
        o.submit(10, VEC, &[write(9, 0, 1)], 0, &[], 0),
        Err(SubmitError::Stall(StallReason::TaskRingFull))
    );
    assert_eq!(o.stats().current, Some(StallReason::TaskRingFull));
    run_one(&mut o);
    o.submit(25, VEC, &[write(9, 0, 1)], 0, &[], 0).unwrap();
    let ring = *o.stats().of(StallReason::TaskRingFull);
    assert_eq!(
        (
            ring.stalls,
            ring.stall_ticks,
            ring.high_water,
            ring.capacity
        ),
        (1, 15, 4, 4)
    );
    assert_eq!(o.stats().current, None);

    // TensorMap: 4 entries, held by live (unfinished) tasks.
    let mut o = Orchestrator::<16, 4, 16>::new(0);
    submit(&mut o, &[write(1, 0, 1), write(2, 0, 1)]).unwrap();
    submit(&mut o, &[write(3, 0, 1), write(4, 0, 1)]).unwrap();
    assert_eq!(
        submit(&mut o, &[write(5, 0, 1)]),
        Err(SubmitError::Stall(StallReason::TensorMapPoolFull))
    );
    run_one(&mut o);
    submit(&mut o, &[write(5, 0, 1)]).unwrap();
    assert_eq!(o.stats().of(StallReason::TensorMapPoolFull).stalls, 1);

    // DepList pool: 2 nodes; a producer's first edge is in its slot, so
    // the fourth consumer of a live producer waits.
    let mut o = Orchestrator::<16, 16, 2>::new(0);
    submit(&mut o, &[write(1, 0, 8)]).unwrap();
    submit(&mut o, &[read(1, 0, 1)]).unwrap();
    submit(&mut o, &[read(1, 1, 1)]).unwrap();
    submit(&mut o, &[read(1, 2, 1)]).unwrap();
    assert_eq!(o.deps.used(), 2, "the first edge takes no node");
    assert_eq!(
        submit(&mut o, &[read(1, 3, 1)]),
        Err(SubmitError::Stall(StallReason::DepListPoolFull))
    );
    run_one(&mut o); // the producer: its edges go back to the pool
    submit(&mut o, &[read(1, 3, 1)]).unwrap();
    assert_eq!(o.stats().of(StallReason::DepListPoolFull).high_water, 2);

    // Heap ring: 1024 bytes.
    let mut o = Orchestrator::<16, 16, 16>::new(1024);
    o.submit(0, VEC, &[], 512, &[], 0).unwrap();
    o.submit(0, VEC, &[], 512, &[], 0).unwrap();
    assert_eq!(
        o.submit(0, VEC, &[], 64, &[], 0),
        Err(SubmitError::Stall(StallReason::HeapRingFull))
    );
    run_one(&mut o);
    let id = o.submit(0, VEC, &[], 64, &[], 0).unwrap();
    let block = loop {
        let t = o.pop_ready(CoreKind::Vector).unwrap();
        if t.id == id {
            break t.heap;
        }
    };
    assert_eq!(
        (block.offset, block.len),
        (0, 64),
        "reuses the freed space at the start"
    );
}

#[test]
fn scopes_hold_tasks_until_they_end() {
    let mut o = Orchestrator::<8, 16, 16>::new(0);
    o.scope_begin("outer").unwrap();
    submit(&mut o, &[write(1, 0, 1)]).unwrap();
    o.scope_begin("inner").unwrap();
    submit(&mut o, &[write(2, 0, 1)]).unwrap();
    run_one(&mut o);
    run_one(&mut o);
    assert_eq!(o.in_flight(), 2, "completed, but held");
    o.scope_end().unwrap();
    assert_eq!(o.in_flight(), 2, "the outer scope still holds both");
    o.scope_end().unwrap();
    assert_eq!(o.in_flight(), 0);
    assert_eq!(o.scope_end(), Err(UsageError::NoOpenScope));
}

fn deadlock<const T: usize, const M: usize, const D: usize>(
    o: &Orchestrator<T, M, D>,
    result: Result<TaskId, SubmitError>,
) -> DeadlockReport {
    match result {
        Err(SubmitError::Deadlock(cause)) => o.report(cause),
        other => panic!("expected a deadlock report, got {other:?}"),
    }
}

#[test]
fn a_scope_larger_than_the_window_is_reported() {
    let mut o = Small::new(0);
    o.scope_begin("layer0").unwrap();
    for i in 0..4 {
        submit(&mut o, &[write(i, 0, 1)]).unwrap();
    }
    while o.ready_count(CoreKind::Vector) > 0 {
        run_one(&mut o);
    }
    let result = submit(&mut o, &[write(9, 0, 1)]);
    let report = deadlock(&o, result);
    assert_eq!(
        report.cause,
        DeadlockCause::ScopeExceedsWindow {
            scope: "layer0",
            window: 4,
            held: 4
        }
    );
    assert_eq!(
        report.occupancy[0],
        Occupancy {
            resource: StallReason::TaskRingFull,
            used: 4,
            capacity: 4
        }
    );
    assert_eq!(report.scopes[0], Some(("layer0", 4)));
    let text = report.to_string();
    assert!(
        text.contains("task_window 4 < 4+ tasks held by scope 'layer0'"),
        "{text}"
    );
    assert!(text.contains("TASK_RING_FULL       4/4"), "{text}");
}

#[test]
fn a_heap_request_larger_than_the_arena_is_reported() {
    let mut o = Small::new(1024);
    let result = o.submit(0, VEC, &[], 4096, &[], 0);
    let report = deadlock(&o, result);
    assert_eq!(
        report.cause,
        DeadlockCause::HeapRequestTooLarge {
            requested: 4096,
            capacity: 1024
        }
    );
    assert!(
        report.to_string().contains("enlarge the heap ring"),
        "{report}"
    );
    assert_eq!(o.in_flight(), 0, "nothing was submitted");
}

#[test]
fn a_task_larger_than_a_pool_is_reported() {
    let mut o = Orchestrator::<16, 2, 16>::new(0);
    let args = [write(0, 0, 1), write(1, 0, 1), write(2, 0, 1)];
    let result = o.submit(0, VEC, &args, 0, &[], 0);
    let report = deadlock(&o, result);
    let pool = StallReason::TensorMapPoolFull;
    assert_eq!(
        report.cause,
        DeadlockCause::TaskExceedsPool {
            pool,
            needed: 3,
            capacity: 2
        }
    );
}

#[test]
fn more_producers_than_deplist_nodes_stall_until_they_complete() {
    let mut o = Orchestrator::<16, 16, 2>::new(0);
    for i in 0..3 {
        submit(&mut o, &[write(i, 0, 1)]).unwrap();
    }
    let deps = [0, 1, 2];
    assert_eq!(
        o.submit(0, VEC, &[], 0, &deps, 0),
        Err(SubmitError::Stall(StallReason::DepListPoolFull))
    );
    assert_eq!(o.check_progress(0, [true, true]), Ok(()));
    let t = o.pop_ready(CoreKind::Vector).unwrap();
    o.complete(t.id).unwrap();
    // Two producers left, two nodes: it fits now, and waits for both.
    let id = o.submit(0, VEC, &[], 0, &deps, 0).unwrap();
    for _ in 0..2 {
        assert!(o.pop_ready(CoreKind::Vector).is_some_and(|t| t.id != id));
    }
    assert!(o.pop_ready(CoreKind::Vector).is_none());
    o.complete(1).unwrap();
    o.complete(2).unwrap();
    assert_eq!(o.pop_ready(CoreKind::Vector).map(|t| t.id), Some(id));
}

#[test]
fn ready_tasks_without_a_core_kind_are_reported() {
    let mut o = Small::new(0);
    let t = o.submit(0, CUBE, &[write(1, 0, 1)], 0, &[], 0).unwrap();
    submit(&mut o, &[read(1, 0, 1)]).unwrap();
    assert_eq!(
        o.check_progress(0, [true, true]),
        Ok(()),
        "a cube core could run it"
    );
    let report = o.check_progress(0, [false, true]).unwrap_err();
    assert_eq!(
        report.cause,
        DeadlockCause::NoCoreForKind {
            kind: CoreKind::Cube
        }
    );
    let first = report.blocked[0].unwrap();
    assert_eq!(
        (first.id, first.kernel_id, first.state),
        (t, CUBE.id, TaskState::Ready)
    );
    let second = report.blocked[1].unwrap();
    assert_eq!(
        (second.state, second.producers, second.waits_on[0]),
        (TaskState::Pending, 1, Some(t))
    );
    assert!(
        report.to_string().contains("give the platform a Cube core"),
        "{report}"
    );
}

#[test]
fn a_dependency_that_can_never_finish_is_reported() {
    let mut o = Small::new(0);
    let lost = submit(&mut o, &[write(1, 0, 1)]).unwrap();
    let _ = o.pop_ready(CoreKind::Vector); // handed out, never completed
    submit(&mut o, &[read(1, 0, 1)]).unwrap();
    assert_eq!(
        o.check_progress(1, [true, true]),
        Ok(()),
        "while it runs, waiting is fine"
    );
    let report = o.check_progress(0, [true, true]).unwrap_err();
    assert_eq!(report.cause, DeadlockCause::Stuck);
    assert_eq!(report.blocked[1].unwrap().waits_on[0], Some(lost));
    assert!(
        report.to_string().contains("waits for 1 producer(s): 0"),
        "{report}"
    );
}

#[test]
fn bad_submissions_are_refused() {
    let mut o = Small::new(0);
    let err = o.submit(0, VEC, &[], 0, &[5], 0).unwrap_err();
    assert_eq!(
        err,
        SubmitError::Invalid(Invalid::UnknownTask { id: 5, next: 0 })
    );
    let err = submit(&mut o, &[read(1, 0, 4), write(1, 2, 4)]).unwrap_err();
    assert_eq!(
        err,
        SubmitError::Invalid(Invalid::ArgsOverlap { index: 1, other: 0 })
    );
    // The writer is named first, wherever it is.
    let err = submit(&mut o, &[write(1, 0, 4), read(1, 2, 4)]).unwrap_err();
    assert_eq!(
        err,
        SubmitError::Invalid(Invalid::ArgsOverlap { index: 0, other: 1 })
    );
    assert_eq!(o.complete(0), Err(UsageError::NotRunning { id: 0 }));
    assert_eq!(o.in_flight(), 0);
}

#[test]
fn explicit_dependencies_order_unrelated_tasks() {
    let mut o = Orchestrator::<16, 16, 16>::new(0);
    let a = submit(&mut o, &[write(1, 0, 1)]).unwrap();
    let b = o.submit(0, VEC, &[write(2, 0, 1)], 0, &[a], 0).unwrap();
    assert_eq!(o.ready_count(CoreKind::Vector), 1);
    assert_eq!(run_one(&mut o), a);
    assert_eq!(run_one(&mut o), b);
}

#[test]
fn a_scope_that_fills_the_tensormap_or_the_heap_is_reported() {
    // TensorMap: 4 entries; the scope's two tasks hold all of them.
    let mut o = Orchestrator::<16, 4, 16>::new(0);
    o.scope_begin("attn").unwrap();
    submit(&mut o, &[write(1, 0, 1), write(2, 0, 1)]).unwrap();
    submit(&mut o, &[write(3, 0, 1), write(4, 0, 1)]).unwrap();
    while o.ready_count(CoreKind::Vector) > 0 {
        run_one(&mut o);
    }
    let result = submit(&mut o, &[write(5, 0, 1)]);
    let report = deadlock(&o, result);
    assert_eq!(
        report.cause,
        DeadlockCause::ScopeExceedsPool {
            scope: "attn",
            pool: StallReason::TensorMapPoolFull,
            held: 2
        }
    );
    assert_eq!(report.occupancy[1].used, 4);
    let text = report.to_string();
    assert!(
        text.contains("TENSORMAP_POOL_FULL is full of the 2 tasks held by scope 'attn'"),
        "{text}"
    );
    // Ending the scope lets them retire, and the same submission goes through.
    o.scope_end().unwrap();
    submit(&mut o, &[write(5, 0, 1)]).unwrap();

    // Heap ring: 1024 bytes, two 512-byte buffers held by the scope.
    let mut o = Orchestrator::<16, 16, 16>::new(1024);
    o.scope_begin("moe").unwrap();
    for i in 0..2 {
        o.submit(0, VEC, &[write(i, 0, 1)], 512, &[], 0).unwrap();
        run_one(&mut o);
    }
    let result = o.submit(0, VEC, &[write(9, 0, 1)], 512, &[], 0);
    let report = deadlock(&o, result);
    assert_eq!(
        report.cause,
        DeadlockCause::ScopeExceedsPool {
            scope: "moe",
            pool: StallReason::HeapRingFull,
            held: 2
        }
    );
    assert_eq!(report.stalled_on, Some(StallReason::HeapRingFull));
    // Outside a scope the same state is a stall: retirement frees the heap.
    o.scope_end().unwrap();
    o.submit(0, VEC, &[write(9, 0, 1)], 512, &[], 0).unwrap();
}

#[test]
fn independent_tiles_of_one_tensor_are_found_by_place() {
    let mut o = Orchestrator::<1024, 1024, 1024>::new(0);
    let tile = |i: u32| TaskArg {
        tensor: 7,
        region: Region {
            offset: [i / 32 * 32, i % 32 * 32, 0, 0],
            extent: [32, 32, 1, 1],
        },
        access: Access::WRITE,
    };
    // 1000 live writers of distinct 32x32 tiles of one 1024x1024 tensor: a
    // lookup by tensor alone would scan all of them for every new tile.
    for i in 0..1000 {
        submit(&mut o, &[tile(i)]).unwrap();
    }
    assert_eq!(o.ready_count(CoreKind::Vector), 1000, "independent");
    let next = tile(1000).region;
    let visited = o.tmap.chain_len(7, &next);
    assert!(visited <= 16, "{visited} entries visited for one tile");
    // A region spanning many cells still finds every overlapping tile.
    let wide = TaskArg {
        tensor: 7,
        region: Region {
            offset: [0, 0, 0, 0],
            extent: [1024, 1024, 1, 1],
        },
        access: Access::READ,
    };
    let id = submit(&mut o, &[wide]).unwrap();
    assert_eq!(o.ready_count(CoreKind::Vector), 1000, "the reader waits");
    while o.is_live(0) || (1..1000).any(|t| o.is_live(t)) {
        run_one(&mut o);
    }
    assert!(o.is_live(id));
    assert_eq!(
        o.ready_count(CoreKind::Vector),
        1,
        "ready once every tile is written"
    );
}

#[test]
fn cells_fit_the_tiles_of_a_tensor() {
    let mut o = Orchestrator::<512, 1024, 1024>::new(0);
    // 256 live writers of single elements of tensor 5, all inside what
    // would be one 64x64 cell: cells fitted to 1-element tiles keep each
    // in its own chain.
    for i in 0..256 {
        submit(&mut o, &[write(5, i, 1)]).unwrap();
    }
    assert_eq!(o.ready_count(CoreKind::Vector), 256, "independent");
    let visited = o.tmap.chain_len(5, &region(100, 1));
    assert_eq!(visited, 1, "entries visited for one element");
    // A reader of all 256 (more cells than a lookup probes one by one)
    // still waits for every writer, and only for them.
    submit(&mut o, &[read(5, 0, 256)]).unwrap();
    submit(&mut o, &[read(5, 256, 8)]).unwrap();
    assert_eq!(
        o.ready_count(CoreKind::Vector),
        257,
        "only the wide reader waits"
    );
    for _ in 0..257 {
        run_one(&mut o);
    }
    assert_eq!(
        o.ready_count(CoreKind::Vector),
        1,
        "the wide reader is ready last"
    );
    run_one(&mut o);
    assert!(o.is_drained());
}

#[test]
fn exact_tiles_meet_only_their_own_cell() {
    let mut o = Orchestrator::<64, 256, 256>::new(0);
    // The first region fixes 4-element cells; these tiles are exactly one
    // cell each, so lookups compare cells instead of boxes.
    let w0 = submit(&mut o, &[write(5, 0, 4)]).unwrap();
    let w1 = submit(&mut o, &[write(5, 4, 4)]).unwrap();
    let r2 = submit(&mut o, &[read(5, 4, 4)]).unwrap(); // RAW on w1
    let w3 = submit(&mut o, &[write(5, 0, 4)]).unwrap(); // WAW on w0 only
    assert_eq!(o.ready_count(CoreKind::Vector), 2, "w0 and w1");
    // w3 covers w0's entry: a lookup of the cell meets w3 alone.
    assert_eq!(o.tmap.chain_len(5, &region(0, 4)), 1);
    // An unaligned reader over two cells waits for the newest writer of each.
    let r4 = submit(&mut o, &[read(5, 2, 4)]).unwrap();
    // An exact writer waits for the unaligned reader of its cell (WAR).
    let w5 = submit(&mut o, &[write(5, 0, 4)]).unwrap();
    assert_eq!(run_one(&mut o), w0);
    assert_eq!(o.ready_count(CoreKind::Vector), 2, "w1, then w3");
    assert_eq!(run_one(&mut o), w1);
    assert_eq!(o.ready_count(CoreKind::Vector), 2, "w3 and r2; r4 waits");
    assert_eq!(run_one(&mut o), w3);
    assert_eq!(o.ready_count(CoreKind::Vector), 2, "r2 and r4; w5 waits");
    assert_eq!(run_one(&mut o), r2);
    assert_eq!(run_one(&mut o), r4);
    assert_eq!(run_one(&mut o), w5);
    assert!(o.is_drained());
}

#[test]
fn a_tensors_cells_are_refitted_to_the_regions_it_keeps_getting() {
    let mut o = Orchestrator::<512, 1024, 1024>::new(0);
    // The first region fixes 64-element cells. 1-element tiles fit another
    // shape: after `REFIT` of them in a row the cells are refitted, though
    // the 64-element entry is live, so later tiles do not share one chain.
    submit(&mut o, &[write(5, 0, 64)]).unwrap();
    for i in 0..32 {
        submit(&mut o, &[write(5, i, 1)]).unwrap();
    }
    // Element 40's lookup meets the first shape's cell (the 64-element
    // write and the tiles placed before the refit), not the 32 tiles.
    let refit = tensor_map::REFIT as usize;
    assert_eq!(o.tmap.chain_len(5, &region(40, 1)), refit);
    // Dependencies stay exact across the two shapes.
    let reader = submit(&mut o, &[read(5, 7, 1)]).unwrap();
    run_one(&mut o);
    assert_eq!(o.ready_count(CoreKind::Vector), 32, "the 1-element writers");
    // Every writer but element 7's (task 8) completes: the reader still waits.
    while let Some(t) = o.pop_ready(CoreKind::Vector) {
        assert_ne!(t.id, reader);
        if t.id != 8 {
            o.complete(t.id).unwrap();
        }
    }
    o.complete(8).unwrap();
    assert_eq!(run_one(&mut o), reader, "then the reader runs");
    assert!(o.is_drained());
    // A whole-tensor access among the tiles, placed when no entry of the
    // tensor is live, keeps the tiles' cells: it goes to the wide bucket,
    // and each later tile meets it and its own cell only.
    let whole = submit(&mut o, &[read(5, 0, 64)]).unwrap();
    for i in 0..32 {
        submit(&mut o, &[write(5, i, 1)]).unwrap();
    }
    assert_eq!(o.tmap.chain_len(5, &region(40, 1)), 1, "the whole read");
    assert_eq!(o.tmap.chain_len(5, &region(7, 1)), 2);
    assert_eq!(run_one(&mut o), whole, "each tile waits for the read (WAR)");
    assert_eq!(o.ready_count(CoreKind::Vector), 32);
}

fn on(o: &mut Orchestrator<16, 64, 64>, stream: StreamId, args: &[TaskArg]) -> TaskId {
    o.submit_on(0, stream, VEC, args, 0, &[], 0).unwrap()
}

fn ready_ids(o: &mut Orchestrator<16, 64, 64>) -> Vec<TaskId> {
    let mut ids = Vec::new();
    while let Some(t) = o.pop_ready(CoreKind::Vector) {
        ids.push(t.id);
    }
    ids
}

#[test]
fn a_stream_releases_each_task_when_the_one_before_is_issued() {
    let mut o = Orchestrator::<16, 64, 64>::new(0);
    // Three independent tasks on stream 1, one on stream 2, one on none.
    let s = [
        on(&mut o, 1, &[write(1, 0, 1)]),
        on(&mut o, 1, &[write(2, 0, 1)]),
        on(&mut o, 1, &[write(3, 0, 1)]),
    ];
    let other = on(&mut o, 2, &[write(4, 0, 1)]);
    let free = on(&mut o, 0, &[write(5, 0, 1)]);
    assert_eq!(ready_ids(&mut o), vec![s[0], other, free]);
    // Handing a task out is not issuing it.
    assert_eq!(ready_ids(&mut o), vec![]);
    o.issued(s[0]).unwrap();
    assert_eq!(
        ready_ids(&mut o),
        vec![s[1]],
        "overlaps with the running s0"
    );
    o.issued(s[0]).unwrap(); // harmless twice
                             // Completing counts as issuing, for callers that do not report issues.
    o.complete(s[1]).unwrap();
    assert_eq!(ready_ids(&mut o), vec![s[2]]);
    for id in [s[0], s[2], other, free] {
        o.complete(id).unwrap();
    }
    assert!(o.is_drained());
    // A task whose predecessor already issued (or retired) is ready at once.
    let a = on(&mut o, 1, &[write(1, 0, 1)]);
    assert_eq!(ready_ids(&mut o), vec![a]);
    o.issued(a).unwrap();
    let b = on(&mut o, 1, &[write(2, 0, 1)]);
    assert_eq!(ready_ids(&mut o), vec![b]);
}

#[test]
fn stream_order_combines_with_data_dependencies() {
    let mut o = Orchestrator::<16, 64, 64>::new(0);
    let w = on(&mut o, 2, &[write(1, 0, 4)]);
    let first = on(&mut o, 1, &[write(9, 0, 1)]);
    // Second on stream 1 also reads w's output: needs both w done and first issued.
    let second = on(&mut o, 1, &[read(1, 0, 4), write(9, 1, 1)]);
    assert_eq!(ready_ids(&mut o), vec![w, first]);
    o.issued(first).unwrap();
    assert_eq!(ready_ids(&mut o), vec![], "still waits for w");
    o.complete(w).unwrap();
    assert_eq!(ready_ids(&mut o), vec![second]);
    // The deadlock report names the stream predecessor as what a task waits on.
    let mut o = Orchestrator::<16, 64, 64>::new(0);
    let a = on(&mut o, 3, &[write(1, 0, 1)]);
    let b = on(&mut o, 3, &[write(2, 0, 1)]);
    let report = o.report(DeadlockCause::Stuck);
    let blocked = report.blocked[1].unwrap();
    assert_eq!((blocked.id, blocked.producers), (b, 1));
    assert_eq!(blocked.waits_on[0], Some(a));
}

#[test]
fn an_event_wait_orders_streams_without_data_dependencies() {
    let mut o = Orchestrator::<16, 64, 64>::new(0);
    let a0 = on(&mut o, 1, &[write(1, 0, 1)]);
    let a1 = on(&mut o, 1, &[write(2, 0, 1)]);
    o.record_event(1, 5).unwrap();
    let a2 = on(&mut o, 1, &[write(3, 0, 1)]); // after the record: not waited on
    o.wait_event(2, 5).unwrap();
    let b0 = on(&mut o, 2, &[write(4, 0, 1)]);
    let b1 = on(&mut o, 2, &[write(5, 0, 1)]);
    let c = on(&mut o, 3, &[write(6, 0, 1)]); // another stream: no wait
    assert_eq!(ready_ids(&mut o), vec![a0, c]);
    o.issued(a0).unwrap();
    assert_eq!(ready_ids(&mut o), vec![a1]);
    o.issued(a1).unwrap();
    assert_eq!(ready_ids(&mut o), vec![a2]);
    o.complete(a0).unwrap();
    o.complete(a2).unwrap();
    assert_eq!(ready_ids(&mut o), vec![], "b0 waits for a1 too");
    o.complete(a1).unwrap();
    assert_eq!(
        ready_ids(&mut o),
        vec![b0],
        "every task before the record completed"
    );
    assert_eq!(ready_ids(&mut o), vec![]);
    o.issued(b0).unwrap();
    assert_eq!(ready_ids(&mut o), vec![b1], "only b0 carried the wait");
    for id in [b0, b1, c] {
        o.complete(id).unwrap();
    }
    assert!(o.is_drained());
}

#[test]
fn a_wait_for_completed_tasks_and_a_rerecorded_event() {
    let mut o = Orchestrator::<16, 64, 64>::new(0);
    let a0 = on(&mut o, 1, &[write(1, 0, 1)]);
    o.record_event(1, 0).unwrap();
    assert_eq!(ready_ids(&mut o), vec![a0]);
    o.complete(a0).unwrap();
    // The event has happened: the waiting task is ready at once.
    o.wait_event(2, 0).unwrap();
    let b0 = on(&mut o, 2, &[write(2, 0, 1)]);
    assert_eq!(ready_ids(&mut o), vec![b0]);
    // Recorded again after a1: a wait now covers a1.
    let a1 = on(&mut o, 1, &[write(3, 0, 1)]);
    o.record_event(1, 0).unwrap();
    o.wait_event(3, 0).unwrap();
    // Two waits on one stream before its task: both hold.
    let a2 = on(&mut o, 2, &[write(4, 0, 1)]);
    o.record_event(2, 1).unwrap();
    o.wait_event(3, 1).unwrap();
    let c = on(&mut o, 3, &[write(5, 0, 1)]);
    assert_eq!(ready_ids(&mut o), vec![a1]);
    o.issued(b0).unwrap();
    assert_eq!(ready_ids(&mut o), vec![a2]);
    o.complete(a1).unwrap();
    assert_eq!(ready_ids(&mut o), vec![], "c also waits for b0 and a2");
    o.complete(b0).unwrap();
    o.complete(a2).unwrap();
    assert_eq!(ready_ids(&mut o), vec![c]);
}

#[test]
fn bad_streams_and_events_are_refused() {
    let mut o = Orchestrator::<16, 64, 64>::new(0);
    let max = crate::abi::MAX_STREAMS as u32;
    assert_eq!(
        o.submit_on(0, max + 1, VEC, &[write(1, 0, 1)], 0, &[], 0),
        Err(SubmitError::Invalid(Invalid::NoSuchStream {
            stream: max + 1
        }))
    );
    assert_eq!(o.submitted(), 0, "nothing changed");
    assert_eq!(
        o.record_event(0, 0),
        Err(UsageError::NoSuchStream { stream: 0 })
    );
    let events = crate::abi::MAX_EVENTS as u32;
    assert_eq!(
        o.record_event(1, events),
        Err(UsageError::NoSuchEvent { event: events })
    );
    assert_eq!(
        o.wait_event(1, 3),
        Err(UsageError::EventNotRecorded { event: 3 })
    );
    assert_eq!(o.issued(0), Err(UsageError::NotRunning { id: 0 }));
    let e = UsageError::EventNotRecorded { event: 3 }.to_string();
    assert!(e.contains("event 3") && e.contains("never recorded"), "{e}");
}

/// Rounds of tile writes, each followed by one task that reads the whole
/// tensor, with nothing completing: a tile write conflicts with the
/// previous round's write of its tile and with the previous whole-tensor
/// reader, which was ordered after that write, so it links to the reader
/// alone. The older readers are ordered before the previous write of the
/// tile (it waited for them), so each round links the same number of
/// edges however many rounds are in flight (the whole-tensor reads would
/// otherwise add one edge per round to every tile write).
#[test]
fn implied_conflicts_behind_a_covering_writer_get_no_edge() {
    let mut o = Orchestrator::<64, 256, 1024>::new(0);
    let mut per_round = std::vec::Vec::new();
    for _ in 0..8 {
        let before = edges(&o);
        for j in 0..4 {
            submit(&mut o, &[write(0, j, 1)]).unwrap();
        }
        submit(&mut o, &[read(0, 0, 4)]).unwrap();
        per_round.push(edges(&o) - before);
    }
    // Round 0: the reader's 4; then 4 tiles x the previous reader + the
    // reader's 4.
    assert_eq!(per_round, [4, 8, 8, 8, 8, 8, 8, 8]);
    // Still exactly ordered: run everything in order of readiness.
    let mut ran = 0;
    while o.ready_count(CoreKind::Vector) > 0 {
        run_one(&mut o);
        ran += 1;
    }
    assert_eq!(ran, 40);
}

/// Slots keep a pass's mark in 32 bits: after the pass count's low bits
/// wrap, a pass must not take a mark left by a pass 2^32 earlier for its
/// own (it would skip that producer and miss the dependency).
///
/// The passes here take a heap block, which sends them down the general
/// path, the one that marks producers (the common case's pass tells a
/// producer met twice by its fan-out list instead: see `Tiles::conflict`).
#[test]
fn a_mark_from_before_the_pass_count_wrapped_is_not_taken_for_a_new_one() {
    let mut o = Orchestrator::<16, 64, 64>::new(1024);
    let marking = |o: &mut Orchestrator<16, 64, 64>, args: &[TaskArg]| {
        o.submit(0, VEC, args, 8, &[], 0).unwrap()
    };
    let a = marking(&mut o, &[write(7, 0, 4)]);
    marking(&mut o, &[read(7, 0, 4)]); // its pass marks `a`
    let marked = o.slot(a).marked_by;
    assert_ne!(marked, 0, "the pass marked its producer");
    // As if 2^32 - `marked` passes had gone by since.
    o.pass = u32::MAX as u64;
    for t in 0..marked {
        marking(&mut o, &[write(100 + t, 0, 1)]);
    }
    let c = marking(&mut o, &[read(7, 0, 4)]);
    assert_eq!(o.slot(c).state, TaskState::Pending, "`c` waits for `a`");
    assert_eq!(run_one(&mut o), a);
    assert_eq!(o.slot(c).state, TaskState::Ready);
}

#[test]
fn a_ring_position_is_restored_from_its_low_bits() {
    assert_eq!(restore(100, 90), 90);
    assert_eq!(restore(100, 100), 100);
    // Across a multiple of 2^32.
    let now = (5 << 32) + 3;
    assert_eq!(restore(now, u32::MAX - 1), (5 << 32) - 2);
    assert_eq!(restore(now, 1), (5 << 32) + 1);
    assert_eq!(restore(u64::MAX, u32::MAX), u64::MAX);
}

/// A submission inserts each argument's entry as soon as its scan ends,
/// so a later argument's scan can meet the task's own entries (same
/// tile, or a neighbour in the same cell or bucket): it must neither wait
/// for itself nor unlink them, and later tasks must still find them.
#[test]
fn a_task_never_waits_for_its_own_earlier_arguments() {
    let mut o = Orchestrator::<16, 64, 64>::new(0);
    // The same tile read twice, and a read and a write of neighbouring
    // tiles of one tensor (one cell: the first region fits the cell to
    // length 4 and both lie in 0..4).
    let twice = submit(&mut o, &[read(3, 0, 4), read(3, 0, 4)]).unwrap();
    let mixed = submit(&mut o, &[read(5, 0, 2), write(5, 2, 2)]).unwrap();
    let wide = submit(&mut o, &[read(6, 0, 64), write(6, 64, 2)]).unwrap();
    assert_eq!(
        o.ready_count(CoreKind::Vector),
        3,
        "none of them waits (for itself or anything)"
    );
    // Later tasks find every argument: a write over the tile read twice,
    // a write over `mixed`'s read tile, a read of its written tile, a
    // write into `wide`'s read region.
    let after_twice = submit(&mut o, &[write(3, 0, 4)]).unwrap();
    let after_read = submit(&mut o, &[write(5, 0, 2)]).unwrap();
    let after_write = submit(&mut o, &[read(5, 2, 2)]).unwrap();
    let after_wide = submit(&mut o, &[write(6, 10, 2)]).unwrap();
    assert_eq!(
        o.ready_count(CoreKind::Vector),
        3,
        "the four later ones wait"
    );
    assert_eq!(run_one(&mut o), twice);
    assert_eq!(run_one(&mut o), mixed);
    assert_eq!(run_one(&mut o), wide);
    let mut rest: Vec<TaskId> = (0..4).map(|_| run_one(&mut o)).collect();
    rest.sort();
    assert_eq!(rest, [after_twice, after_read, after_write, after_wide]);
    assert!(o.is_drained());
}

/// Rounds of tile writes and a read of the whole tensor (the scheduling
/// bench's fan-out/fan-in): a tile write after a round needs only that
/// round's whole read, whose read of the tile was ordered after the tile's
/// last writer. Its scan meets that writer (in the tile's bucket) before
/// the reader (in the wide bucket), so the reader rule applies at the end
/// of the argument, to the writer conflicts held until then.
#[test]
fn a_tile_write_links_only_to_the_whole_read_after_its_last_writer() {
    let mut o = Orchestrator::<16, 64, 64>::new(0);
    let tiles: Vec<TaskId> = (0..4)
        .map(|j| submit(&mut o, &[write(7, j, 1)]).unwrap())
        .collect();
    let all = submit(&mut o, &[read(7, 0, 4)]).unwrap();
    assert_eq!(edges(&o), 4, "the whole read waits for the four tiles");
    let again = submit(&mut o, &[write(7, 2, 1)]).unwrap();
    assert_eq!(
        edges(&o),
        5,
        "one edge, from the whole read, not also from the tile's writer"
    );
    // A read of tiles 1 and 2 waits for their writers; a write of tile 1
    // after it needs no edge from tile 1's writer (the read of all of
    // tile 1 orders it), but one from each reader of the tile: the whole
    // read (implied through `again`, which the rules do not follow) and
    // the part read.
    let part = submit(&mut o, &[read(7, 1, 2)]).unwrap();
    assert_eq!(edges(&o), 7, "tile 1's writer and `again`");
    let last = submit(&mut o, &[write(7, 1, 1)]).unwrap();
    assert_eq!(edges(&o), 9, "the two readers of tile 1");
    // Everything still runs in an order the accesses allow.
    let mut order = Vec::new();
    while let Some(t) = o.pop_ready(CoreKind::Vector) {
        order.push(t.id);
        o.complete(t.id).unwrap();
    }
    let at = |id| order.iter().position(|&t| t == id).unwrap();
    assert_eq!(order.len(), 8);
    for &t in &tiles {
        assert!(at(t) < at(all));
    }
    assert!(at(all) < at(again) && at(again) < at(part) && at(part) < at(last));
    assert!(at(tiles[1]) < at(last));
    assert!(o.is_drained());
}

/// A submission whose edges must be counted first (fewer DepList nodes
/// free than tasks in flight) and that has more producers and covers more
/// entries than the counting pass remembers ([`FOUND`], the TensorMap's
/// `PENDING`) commits by scanning again: every producer gets its edge and
/// every covered entry is unlinked.
#[test]
fn a_counted_submission_with_more_producers_than_it_remembers_scans_again() {
    let mut o = Orchestrator::<1024, 1024, 290>::new(0);
    let tiles = FOUND as u32 + 8;
    let writers: Vec<TaskId> = (0..tiles)
        .map(|t| submit(&mut o, &[write(9, t, 1)]).unwrap())
        .collect();
    for t in 0..12 {
        submit(&mut o, &[write(10, t, 1)]).unwrap();
    }
    assert!(o.deps.available() < o.in_flight() as usize, "counted first");
    let all = submit(&mut o, &[write(9, 0, tiles)]).unwrap();
    assert_eq!(edges(&o), tiles as usize, "one edge per tile writer");
    // The tile writers' entries are covered: a later read of a tile finds
    // the whole write alone.
    let read_tile = submit(&mut o, &[read(9, 3, 1)]).unwrap();
    assert_eq!(edges(&o), tiles as usize + 1);
    let mut order = Vec::new();
    while let Some(t) = o.pop_ready(CoreKind::Vector) {
        order.push(t.id);
        o.complete(t.id).unwrap();
    }
    assert_eq!(order.len(), tiles as usize + 12 + 2);
    let at = |id| order.iter().position(|&t| t == id).unwrap();
    for &w in &writers {
        assert!(at(w) < at(all), "the whole write after tile writer {w}");
    }
    assert!(at(all) < at(read_tile));
    assert!(o.is_drained());
}

/// A submission whose edges must be counted first, and whose argument
/// conflicts with more tasks than a pass holds back ([`HELD`]) but fewer
/// than the counting pass remembers ([`FOUND`]): the commit links every
/// producer the counting pass found, the held ones (linked at the
/// argument's end in a counting pass) as the rest.
#[test]
fn a_counted_argument_with_more_conflicts_than_it_holds_links_them_all() {
    let mut o = Orchestrator::<64, 64, 24>::new(0);
    let tiles = HELD as u32 + 4;
    let writers: Vec<TaskId> = (0..tiles)
        .map(|t| submit(&mut o, &[write(9, t, 1)]).unwrap())
        .collect();
    for t in 0..6 {
        submit(&mut o, &[write(10, t, 1)]).unwrap();
    }
    assert!(o.deps.available() < o.in_flight() as usize, "counted first");
    let all = submit(&mut o, &[read(9, 0, tiles)]).unwrap();
    assert_eq!(edges(&o), tiles as usize, "one edge per tile writer");
    // Every writer but the last done: the read still waits.
    let mut done = Vec::new();
    while let Some(t) = o.pop_ready(CoreKind::Vector) {
        done.push(t.id);
    }
    assert!(!done.contains(&all));
    for &id in &done {
        if id != writers[tiles as usize - 1] {
            o.complete(id).unwrap();
        }
    }
    assert!(
        o.pop_ready(CoreKind::Vector).is_none(),
        "waits for the last writer"
    );
    o.complete(writers[tiles as usize - 1]).unwrap();
    assert_eq!(o.pop_ready(CoreKind::Vector).map(|t| t.id), Some(all));
}

/// Plays a random program on `o` (seeded): submissions of tiles and odd
/// regions on three tensors, on streams, with heap blocks, explicit
/// dependencies and scopes, interleaved with issuing and completing ready
/// tasks, until every task retired (then, for even seeds, opens a scope
/// and leaves it open). Returns what every call returned and the final
/// statistics, as text, for comparing two orchestrators.
fn play(o: &mut Orchestrator<8, 24, 24>, seed: u64) -> Vec<String> {
    play_until(o, seed, true)
}

/// [`play`], or with `drain` false its random steps only: what they
/// leave (tasks in flight, ready, running or held by an open scope,
/// edges in the DepList pool, heap blocks) stays, as after a run that
/// ended early.
fn play_until(o: &mut Orchestrator<8, 24, 24>, seed: u64, drain: bool) -> Vec<String> {
    let mut state = seed | 1;
    let mut rand = |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    let mut log = Vec::new();
    let mut running: Vec<TaskId> = Vec::new();
    let mut scoped = false;
    for step in 0..400u64 {
        match rand(20) {
            0..=7 => {
                let args: Vec<TaskArg> = (0..1 + rand(3))
                    .map(|i| {
                        let (start, len) = if rand(3) == 0 {
                            (rand(8) as u32, 1 + rand(8) as u32)
                        } else {
                            (4 * rand(4) as u32, 4)
                        };
                        let access = if rand(2) == 0 {
                            Access::READ
                        } else {
                            Access::WRITE
                        };
                        TaskArg {
                            // Distinct tensors: a task's arguments never overlap.
                            tensor: i as u32,
                            region: region(start, len),
                            access,
                        }
                    })
                    .collect();
                let kernel = if rand(2) == 0 { VEC } else { CUBE };
                let deps: Vec<TaskId> = match o.submitted() {
                    0 => Vec::new(),
                    n if rand(4) == 0 => vec![rand(n)],
                    _ => Vec::new(),
                };
                let heap = [0, 0, 64, 200][rand(4) as usize];
                let got = o.submit_on(step, rand(3) as StreamId, kernel, &args, heap, &deps, step);
                log.push(format!("submit {got:?}"));
            }
            8..=12 => {
                let kind = if rand(2) == 0 {
                    CoreKind::Vector
                } else {
                    CoreKind::Cube
                };
                if let Some(t) = o.pop_ready(kind) {
                    log.push(format!("pop {t:?} issued {:?}", o.issued(t.id)));
                    running.push(t.id);
                }
            }
            13..=18 if !running.is_empty() => {
                let id = running.remove(rand(running.len() as u64) as usize);
                log.push(format!("complete {id} {:?}", o.complete(id)));
            }
            19 => {
                let got = if scoped {
                    o.scope_end()
                } else {
                    o.scope_begin("s")
                };
                scoped = !scoped;
                log.push(format!("scope {got:?}"));
            }
            _ => {}
        }
    }
    if !drain {
        return log;
    }
    if scoped {
        log.push(format!("scope {:?}", o.scope_end()));
    }
    while !o.is_drained() {
        for kind in [CoreKind::Vector, CoreKind::Cube] {
            while let Some(t) = o.pop_ready(kind) {
                log.push(format!("pop {t:?} issued {:?}", o.issued(t.id)));
                running.push(t.id);
            }
        }
        let id = running
            .pop()
            .expect("a drained orchestrator or a running task");
        log.push(format!("drain {id} {:?}", o.complete(id)));
    }
    log.push(format!("{:?}", o.stats()));
    if seed.is_multiple_of(2) {
        // Drained with a scope open: a recycled orchestrator has none.
        log.push(format!("scope {:?}", o.scope_begin("left open")));
    }
    log
}

#[test]
fn a_recycled_orchestrator_behaves_as_a_new_one() {
    for seed in 1..40u64 {
        let fresh = play(&mut Orchestrator::new(1024), seed);
        let mut o = Orchestrator::new(1024);
        play(&mut o, seed * 7919);
        assert!(o.recycle(), "drained");
        assert_eq!(play(&mut o, seed), fresh, "seed {seed}");
        // Recycled again, after a program that leaves other cell shapes.
        assert!(o.recycle());
        play(&mut o, seed + 1000);
        assert!(o.recycle());
        assert_eq!(play(&mut o, seed), fresh, "seed {seed}, twice");
    }
}

#[test]
fn a_reset_orchestrator_behaves_as_a_new_one_whatever_a_run_left() {
    let mut left_in_flight = 0;
    for seed in 1..60u64 {
        let fresh = play(&mut Orchestrator::new(1024), seed);
        let mut o = Orchestrator::new(1024);
        play_until(&mut o, seed * 7919, false);
        left_in_flight += o.in_flight();
        o.reset();
        assert!(o.is_drained() && o.submitted() == 0);
        assert_eq!(play(&mut o, seed), fresh, "seed {seed}");
        // Reset again, after a run that ended early with other cell
        // shapes, streams and scopes.
        play_until(&mut o, seed + 1000, false);
        o.reset();
        assert_eq!(play(&mut o, seed), fresh, "seed {seed}, twice");
    }
    // The runs ended with work left (else this is `recycle`'s test).
    assert!(left_in_flight > 60, "{left_in_flight} tasks left in flight");
}

#[test]
fn a_reset_forgets_the_tasks_left_in_flight() {
    let mut o = Small::new(0);
    let w = submit(&mut o, &[write(1, 0, 4)]).unwrap();
    submit(&mut o, &[read(1, 0, 4)]).unwrap();
    assert_eq!(o.pop_ready(CoreKind::Vector).map(|t| t.id), Some(w));
    o.reset();
    // Neither the running writer nor the waiting reader is known: their
    // ids are refused, and new ids start at 0 with nothing to wait for.
    assert_eq!(o.complete(w), Err(UsageError::NotRunning { id: w }));
    assert_eq!(submit(&mut o, &[read(1, 0, 4)]), Ok(0));
    assert_eq!(o.pop_ready(CoreKind::Vector).map(|t| t.id), Some(0));
    assert_eq!(submit(&mut o, &[write(1, 0, 4)]), Ok(1));
    assert!(
        o.pop_ready(CoreKind::Vector).is_none(),
        "waits for task 0's read"
    );
    assert_eq!(o.complete(0), Ok(()));
    assert_eq!(o.pop_ready(CoreKind::Vector).map(|t| t.id), Some(1));
}

/// `set_window` tells a window out of range (naming the ring's size) from
/// one set while tasks are in flight (naming how many), and changes
/// nothing either way. `Small` is a ring of 4 tasks, so 4 is the largest
/// window; two submitted and not completed tasks are 2 in flight.
#[test]
fn set_window_tells_out_of_range_from_tasks_in_flight() {
    let mut o = Small::new(0);
    assert_eq!(
        o.set_window(0),
        Err(WindowError::OutOfRange { tasks: 0, max: 4 })
    );
    assert_eq!(
        o.set_window(5),
        Err(WindowError::OutOfRange { tasks: 5, max: 4 })
    );
    assert_eq!(o.window(), 4, "a refused window leaves the ring's own");
    submit(&mut o, &[write(1, 0, 4)]).unwrap();
    submit(&mut o, &[write(2, 0, 4)]).unwrap();
    assert_eq!(o.set_window(2), Err(WindowError::InFlight { in_flight: 2 }));
    assert_eq!(o.window(), 4);
    // Out of range is reported first, whatever is in flight.
    assert_eq!(
        o.set_window(9),
        Err(WindowError::OutOfRange { tasks: 9, max: 4 })
    );
    run_one(&mut o);
    run_one(&mut o);
    assert_eq!(o.set_window(2), Ok(()));
    assert_eq!(o.window(), 2);
    assert!(WindowError::InFlight { in_flight: 2 }
        .to_string()
        .contains("2 tasks are in flight"));
    assert!(WindowError::OutOfRange { tasks: 5, max: 4 }
        .to_string()
        .contains("1 to 4"));
}

/// Leaves `o` (fresh or reset) drained after a stall that went stale: a
/// window of one task, so the second submission stalls, then the first
/// completes.
fn stall_then_drain(o: &mut Small) {
    o.set_window(1).unwrap();
    assert_eq!(submit(o, &[write(1, 0, 4)]), Ok(0));
    assert_eq!(
        submit(o, &[write(1, 0, 4)]),
        Err(SubmitError::Stall(StallReason::TaskRingFull))
    );
    assert_eq!(run_one(o), 0);
    assert!(o.is_drained());
}

/// A stall that went stale before a scope opened is no deadlock: with
/// nothing in flight the scope holds no task, and a retry succeeds.
#[test]
fn a_scope_opened_after_a_stale_stall_is_no_deadlock() {
    let mut o = Small::new(0);
    stall_then_drain(&mut o);
    o.scope_begin("after").unwrap();
    assert_eq!(
        o.check_progress(0, [true, true]).map_err(|r| r.cause),
        Ok(()),
        "the open scope holds nothing"
    );
    assert_eq!(submit(&mut o, &[write(1, 0, 4)]), Ok(1));
    o.scope_end().unwrap();
}

/// A scope left open with tasks in it does not outlive a reset: once the
/// next run drains after a stall, there is no deadlock to report.
#[test]
fn a_reset_forgets_the_scope_its_tasks_were_in() {
    let mut o = Small::new(0);
    o.scope_begin("left open").unwrap();
    for _ in 0..3 {
        submit(&mut o, &[write(1, 0, 4)]).unwrap();
    }
    o.reset();
    stall_then_drain(&mut o);
    assert_eq!(
        o.check_progress(0, [true, true]).map_err(|r| r.cause),
        Ok(()),
        "nothing in flight and no scope open: a retry succeeds"
    );
    assert_eq!(submit(&mut o, &[write(1, 0, 4)]), Ok(1));
}

#[test]
fn an_orchestrator_with_tasks_in_flight_is_not_recycled() {
    let mut o = Small::new(0);
    let w = submit(&mut o, &[write(1, 0, 4)]).unwrap();
    let r = submit(&mut o, &[read(1, 0, 4)]).unwrap();
    assert!(!o.recycle(), "two tasks in flight");
    // Unchanged: the reader still waits for the writer, and ids go on.
    assert_eq!(run_one(&mut o), w);
    assert_eq!(run_one(&mut o), r);
    assert_eq!(submit(&mut o, &[write(1, 0, 4)]), Ok(2));
    run_one(&mut o);
    assert!(o.recycle());
    assert_eq!(submit(&mut o, &[write(1, 0, 4)]), Ok(0), "ids start again");
}

/// `finished` is the release graph's report: for a task submitted without
/// the graph that has a consumer, it would leave the consumer waiting for
/// ever, and is refused; `complete` releases it.
#[test]
fn finished_refuses_a_task_whose_consumers_it_would_strand() {
    let mut o = Small::new(0);
    let w = submit(&mut o, &[write(1, 0, 4)]).unwrap();
    let r = submit(&mut o, &[read(1, 0, 4)]).unwrap();
    assert_eq!(o.pop_ready(CoreKind::Vector).map(|t| t.id), Some(w));
    assert_eq!(o.finished(w), Err(UsageError::OwnerCompletes { id: w }));
    assert!(o.is_live(w), "refused: nothing changed");
    o.complete(w).unwrap();
    assert_eq!(o.pop_ready(CoreKind::Vector).map(|t| t.id), Some(r));
    // No consumer: nothing to strand, so `finished` retires it.
    assert_eq!(o.finished(r), Ok(()));
    assert!(o.is_drained());
}

/// The common case's pass marks no producer: a producer met through two
/// arguments is told by its fan-out list, which starts with the new
/// task's edge then, in that pass and in the general pass that takes over
/// from an argument that is not a simple tile.
#[test]
fn a_producer_met_through_two_arguments_gets_one_edge() {
    let mut o = Orchestrator::<16, 64, 64>::new(0);
    let p = submit(&mut o, &[write(1, 0, 4), write(2, 0, 4)]).unwrap();
    // Two tiles, each the cell of its tensor.
    let t = submit(&mut o, &[read(1, 0, 4), read(2, 0, 4)]).unwrap();
    assert_eq!(edges(&o), 1, "one edge p -> t");
    assert_eq!(o.slot(t).fanin, 1);
    // A tile, then a region across two of tensor 2's cells of 4 (not
    // simple: the general pass takes over).
    let u = submit(&mut o, &[read(1, 0, 4), read(2, 2, 4)]).unwrap();
    assert_eq!(edges(&o), 2, "one edge p -> u");
    assert_eq!(o.slot(u).fanin, 1);
    // The other way round: the general pass from the first argument on.
    let v = submit(&mut o, &[read(2, 2, 4), read(1, 0, 4)]).unwrap();
    assert_eq!(edges(&o), 3, "one edge p -> v");
    assert_eq!(o.slot(v).fanin, 1);
    assert_eq!(run_one(&mut o), p);
    assert_eq!(
        o.ready_count(CoreKind::Vector),
        3,
        "t, u and v released once each"
    );
    for _ in 0..3 {
        run_one(&mut o);
    }
    assert!(o.is_drained());
}

/// A submission that stalled is tried again once a [`REFILL_SHARE`]th of
/// the window is free (4 tasks of a window of 256), not after each
/// retirement; while a scope is open, after every one (the retry is what
/// reports a scope that outgrew the window). Below `REFILL_SHARE` tasks a
/// window has no share to wait for: the retirement a stalled submitter
/// waits for anyway is enough.
#[test]
fn a_stalled_submission_waits_for_a_share_of_the_window() {
    type Orch = Orchestrator<256, 512, 512>;
    let fill = |o: &mut Orch, from: u32| {
        for i in from..256 {
            assert!(submit(o, &[write(1, 4 * i, 4)]).is_ok());
        }
        assert_eq!(
            submit(o, &[write(1, 0, 4)]),
            Err(SubmitError::Stall(StallReason::TaskRingFull))
        );
    };
    let mut o = Orch::new(0);
    fill(&mut o, 0);
    assert!(!o.retry_now(), "the window is full");
    for free in 1..4 {
        run_one(&mut o);
        assert!(!o.retry_now(), "{free} of 256 free: below a 64th");
    }
    run_one(&mut o);
    assert!(o.retry_now(), "4 of 256 free");

    // The last 56 tasks in a scope: the window is full, and the first 200
    // can retire.
    let mut o = Orch::new(0);
    for i in 0..200 {
        assert!(submit(&mut o, &[write(1, 4 * i, 4)]).is_ok());
    }
    o.scope_begin("last").unwrap();
    fill(&mut o, 200);
    assert!(o.retry_now(), "an open scope retries");
    run_one(&mut o);
    assert!(o.retry_now(), "1 of 256 free, in a scope");

    let mut o = Orch::new(0);
    o.set_window(63).unwrap();
    for i in 0..63 {
        assert!(submit(&mut o, &[write(1, 4 * i, 4)]).is_ok());
    }
    // No share to wait for: the retirement the submitter waits for anyway
    // is enough.
    assert!(o.retry_now(), "a window of 63 waits for no share");
}

/// Tiles beside a live wide entry, committed through the release graph
/// (their own lean path), wait for exactly the tasks their accesses
/// conflict with, the wide ones included, by edges that no covering
/// access implies. By hand, with cells of 4
/// elements (t0's tile sets the shape): t1 writes all 16 elements after
/// t0's write; t2 reads 4..8 (after t1); t3 writes 8..12 (after t1, not
/// t2); t4 reads all (after t3, and after t1 where t3 did not write);
/// t5 writes 4..8 (after the reads of t2 and t4); t6 reads all (after
/// t1, t3 and t5); t7 writes 4..8 again (after t6's read, which came
/// after t5's write: the tile's last writer, in its own bucket, gets no
/// edge of its own, as the tile writes of rounds after a fan-in).
#[test]
fn tiles_beside_a_wide_entry_wait_for_it_through_the_graph() {
    use crate::orch::ReleaseGraph;
    let graph = ReleaseGraph::<16, 64>::new();
    let mut o = Orchestrator::<16, 64, 64>::new(0);
    let args = [
        write(1, 0, 4),
        write(1, 0, 16),
        read(1, 4, 4),
        write(1, 8, 4),
        read(1, 0, 16),
        write(1, 4, 4),
        read(1, 0, 16),
        write(1, 4, 4),
    ];
    let mut ready_at_once = Vec::new();
    for (tag, a) in args.iter().enumerate() {
        let (id, ready) = o
            .submit_linked(&graph, 0, 0, VEC, core::slice::from_ref(a), 0, tag as u64)
            .unwrap();
        assert_eq!(id, tag as u64);
        if ready {
            ready_at_once.push(id);
        }
    }
    assert_eq!(ready_at_once, [0], "only t0 waits for nothing");
    // t3 waits for t1's write by an edge; t5 for t2 and t4 only: t1 was
    // ordered before t4's read of all of t5's region, so its edge would
    // be implied.
    assert!(graph.waits_for(3, 1));
    assert!(graph.waits_for(5, 2) && graph.waits_for(5, 4));
    assert!(!graph.waits_for(5, 1), "no implied edge from t1");
    assert!(graph.waits_for(7, 6));
    assert!(
        !graph.waits_for(7, 5),
        "no implied edge from the tile's writer"
    );
    let complete = |o: &mut Orchestrator<16, 64, 64>, id: u64| {
        let mut released = Vec::new();
        graph.complete(id as usize % 16, |tag| released.push(tag));
        o.finished_unretired(id).unwrap();
        o.retire_completed();
        released.sort_unstable();
        released
    };
    assert_eq!(complete(&mut o, 0), [1]);
    assert_eq!(complete(&mut o, 1), [2, 3], "t2 and t3 waited for t1 only");
    assert_eq!(complete(&mut o, 3), [4], "t4's last writer");
    assert_eq!(complete(&mut o, 2), [] as [u64; 0], "t5 still waits for t4");
    assert_eq!(complete(&mut o, 4), [5]);
    assert_eq!(complete(&mut o, 5), [6], "t6's last writer");
    assert_eq!(complete(&mut o, 6), [7]);
    assert_eq!(complete(&mut o, 7), [] as [u64; 0]);
    assert!(o.is_drained());
}
