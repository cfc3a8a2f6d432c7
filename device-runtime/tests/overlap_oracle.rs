//! `Region::overlaps`, and the orchestrator's dependency inference (its
//! TensorMap, reached through the public API), against the element-set
//! oracle: two accesses conflict iff the sets of elements they touch (their
//! linear offsets under the tensor's strides) intersect and one of them
//! writes. Regions are random boxes in small rank-1..4 tensors with
//! row-major, sometimes padded, strides; the second region of a pair is
//! often placed against the first (sharing one corner element, or just
//! adjacent), where an off-by-one in an interval test would show.

use device_runtime::abi::{Access, Region};
use device_runtime::orch::{KernelRef, Orchestrator, SubmitError, TaskArg};
use device_runtime::CoreKind;
use proptest::prelude::*;

mod element_sets;
use element_sets::{conflict, conflicts_with_itself, elements, share_an_element, Sweep, Touch};

/// A tensor: sizes 1 ..= 6 in its `rank` dimensions (1 beyond), row major
/// with up to 3 elements of padding after each row of each dimension.
#[derive(Clone, Debug)]
struct Tensor {
    shape: [u32; 4],
    strides: [u64; 4],
}

fn tensor() -> impl Strategy<Value = Tensor> {
    (
        1usize..=4,
        prop::array::uniform4(1u32..=6),
        prop::array::uniform4(0u64..=3),
    )
        .prop_map(|(rank, mut shape, pad)| {
            for s in &mut shape[rank..] {
                *s = 1;
            }
            let mut strides = [1u64; 4];
            for d in (0..3).rev() {
                strides[d] = strides[d + 1] * shape[d + 1] as u64 + pad[d];
            }
            Tensor { shape, strides }
        })
}

/// Where the second region of a pair starts in one dimension, relative to
/// the first `a0 .. a1` (clamped into the tensor).
#[derive(Clone, Copy, Debug)]
enum Place {
    Anywhere(u32),
    /// On the first's last index: shares one index (a corner when every
    /// dimension does).
    OnLast,
    /// Just after the first: adjacent, sharing nothing.
    After,
    /// Ending on the first's first index.
    EndOnFirst,
}

fn region_in(shape: [u32; 4]) -> impl Strategy<Value = Region> {
    let dims: Vec<_> = shape
        .iter()
        .map(|&s| (0..s).prop_flat_map(move |o| (Just(o), 1..=s - o)))
        .collect();
    dims.prop_map(|d| Region {
        offset: [d[0].0, d[1].0, d[2].0, d[3].0],
        extent: [d[0].1, d[1].1, d[2].1, d[3].1],
    })
}

fn place() -> impl Strategy<Value = Place> {
    prop_oneof![
        (0u32..6).prop_map(Place::Anywhere),
        Just(Place::OnLast),
        Just(Place::After),
        Just(Place::EndOnFirst),
    ]
}

/// A second region placed against `a` dimension by dimension.
fn placed(t: &Tensor, a: &Region, places: [Place; 4], extents: [u32; 4]) -> Region {
    let mut r = Region {
        offset: [0; 4],
        extent: [1; 4],
    };
    for d in 0..4 {
        let size = t.shape[d];
        let (a0, a1) = (a.offset[d], a.offset[d] + a.extent[d]);
        let want = 1 + extents[d] % size;
        let start = match places[d] {
            Place::Anywhere(o) => o,
            Place::OnLast => a1 - 1,
            Place::After => a1,
            Place::EndOnFirst => (a0 + 1).saturating_sub(want),
        };
        let start = start.min(size - 1);
        r.offset[d] = start;
        r.extent[d] = want.min(size - start);
    }
    r
}

fn pair() -> impl Strategy<Value = (Tensor, Region, Region)> {
    tensor().prop_flat_map(|t| {
        let shape = t.shape;
        (
            Just(t),
            region_in(shape),
            prop::bool::ANY,
            region_in(shape),
            prop::array::uniform4(place()),
            prop::array::uniform4(0u32..6),
        )
            .prop_map(|(t, a, free, b, places, extents)| {
                let b = if free {
                    b
                } else {
                    placed(&t, &a, places, extents)
                };
                (t, a, b)
            })
    })
}

fn elems(t: &Tensor, r: &Region) -> Vec<u64> {
    elements(&r.offset, &r.extent, &t.strides)
}

const ACCESS: [Access; 3] = [
    Access::READ,
    Access::WRITE,
    Access::READ.union(Access::WRITE),
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(20_000))]

    #[test]
    fn overlaps_iff_the_element_sets_intersect((t, a, b) in pair()) {
        let shared = share_an_element(&elems(&t, &a), &elems(&t, &b));
        prop_assert_eq!(a.overlaps(&b), shared, "{:?} {:?} in {:?}", a, b, t);
        prop_assert_eq!(b.overlaps(&a), shared);
    }
}

const KERNEL: KernelRef = KernelRef {
    id: 1,
    kind: CoreKind::Cube,
};

/// One task of a sequence: 1 to 3 arguments on two tensors.
type Spec = Vec<(usize, Region, usize)>;

fn task_of(tensors: &[Tensor; 2]) -> impl Strategy<Value = Spec> {
    let arg = |t: &Tensor| region_in(t.shape);
    prop::collection::vec(
        (0usize..2, arg(&tensors[0]), arg(&tensors[1]), 0usize..3)
            .prop_map(|(i, r0, r1, a)| (i, if i == 0 { r0 } else { r1 }, a)),
        1..=3,
    )
}

/// Two tensors and up to 10 tasks, plus the order of completions (indices
/// into whatever is running).
fn program() -> impl Strategy<Value = ([Tensor; 2], Vec<Spec>, Vec<usize>)> {
    (tensor(), tensor()).prop_flat_map(|(t0, t1)| {
        let tensors = [t0, t1];
        (
            Just(tensors.clone()),
            prop::collection::vec(task_of(&tensors), 1..=10),
            prop::collection::vec(0usize..10, 10),
        )
    })
}

/// The oracle's view of a task: tensor `i`'s elements start at `i << 12` (no tensor here spans more than 2061 elements).
fn touches(tensors: &[Tensor; 2], spec: &Spec) -> Vec<Touch> {
    spec.iter()
        .map(|&(i, region, a)| Touch {
            elements: elems(&tensors[i], &region)
                .into_iter()
                .map(|e| ((i as u64) << 12) + e)
                .collect(),
            writes: ACCESS[a].contains(Access::WRITE),
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3_000))]

    /// Submits every task before completing any, then completes them in a
    /// random order: a task is handed out exactly when every earlier task
    /// it conflicts with (by element sets) has completed. A task whose own
    /// arguments conflict is refused.
    #[test]
    fn the_orchestrator_orders_exactly_the_conflicting_tasks((tensors, specs, order) in program()) {
        let mut o = Orchestrator::<16, 32, 64>::new(0);
        let mut accepted: Vec<Vec<Touch>> = Vec::new();
        for spec in &specs {
            let args: Vec<TaskArg> = spec
                .iter()
                .map(|&(i, region, a)| TaskArg { tensor: i as u32, region, access: ACCESS[a] })
                .collect();
            let touch = touches(&tensors, spec);
            let result = o.submit(0, KERNEL, &args, 0, &[], 0);
            if conflicts_with_itself(&touch) {
                let refused = matches!(result, Err(SubmitError::Invalid(_)));
                prop_assert!(refused, "{:?}", result);
                continue;
            }
            prop_assert_eq!(result.ok(), Some(accepted.len() as u64));
            accepted.push(touch);
        }
        let n = accepted.len();
        let mut done = vec![false; n];
        let mut handed = vec![false; n];
        let mut running = Vec::new();
        let mut orders = order.iter().cycle();
        loop {
            // What the oracle says may run now.
            let may_run: Vec<bool> = (0..n)
                .map(|t| (0..t).all(|u| done[u] || !conflict(&accepted[u], &accepted[t])))
                .collect();
            while let Some(task) = o.pop_ready(CoreKind::Cube) {
                let t = task.id as usize;
                prop_assert!(!handed[t], "task {} handed out twice", t);
                prop_assert!(may_run[t], "task {} handed out before a conflicting task completed", t);
                handed[t] = true;
                running.push(t);
            }
            for t in 0..n {
                prop_assert!(
                    handed[t] || !may_run[t],
                    "task {} has no pending conflict but was not handed out", t
                );
            }
            if running.is_empty() {
                break;
            }
            let t = running.swap_remove(orders.next().unwrap() % running.len());
            o.complete(t as u64).unwrap();
            done[t] = true;
        }
        prop_assert!(done.iter().all(|&d| d), "every task ran");
        prop_assert!(o.is_drained());
    }

    /// The sweep's direct predecessors are conflicting tasks, and every
    /// conflicting pair is linked by a chain of them (what the stress tests
    /// rely on when they check only direct predecessors).
    #[test]
    fn the_sweep_links_every_conflicting_pair((tensors, specs, _order) in program()) {
        let tasks: Vec<Vec<Touch>> = specs
            .iter()
            .map(|s| touches(&tensors, s))
            .filter(|t| !conflicts_with_itself(t))
            .collect();
        let mut sweep = Sweep::new(2 << 12);
        let mut before: Vec<Vec<bool>> = Vec::new();
        for (t, task) in tasks.iter().enumerate() {
            let mut reach = vec![false; tasks.len()];
            for u in sweep.task(task) {
                let u = u as usize;
                prop_assert!(u < t && conflict(&tasks[u], task), "{} is no producer of {}", u, t);
                reach[u] = true;
                for (w, r) in before[u].iter().enumerate() {
                    reach[w] |= r;
                }
            }
            for (u, earlier) in tasks[..t].iter().enumerate() {
                prop_assert!(reach[u] || !conflict(earlier, task), "{} before {} unlinked", u, t);
            }
            before.push(reach);
        }
    }
}
