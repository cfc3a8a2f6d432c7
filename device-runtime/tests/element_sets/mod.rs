//! A dependency oracle built from element sets, independent of
//! `Region::overlaps` and of the TensorMap: every access is the explicit
//! list of the elements (linear offsets, or arena bytes) it touches, and two
//! accesses conflict iff those sets share an element and at least one of the
//! two writes. Nothing here intersects intervals or boxes.
//!
//! Shared by the orchestrator's stress test, the overlap property tests and
//! (through `#[path]`) the executor's random-DAG test in `tests/`.

#![allow(dead_code)] // each test target uses part of it

use std::collections::HashSet;

/// The linear offsets (in elements) of every element of the region
/// `offset .. offset + extent` of a tensor with element `strides`: one
/// entry per index tuple, enumerated one by one.
pub fn elements(offset: &[u32; 4], extent: &[u32; 4], strides: &[u64; 4]) -> Vec<u64> {
    let count: u64 = extent.iter().map(|&e| e as u64).product();
    let mut out = Vec::with_capacity(count as usize);
    for i0 in 0..extent[0] as u64 {
        for i1 in 0..extent[1] as u64 {
            for i2 in 0..extent[2] as u64 {
                for i3 in 0..extent[3] as u64 {
                    let index = [
                        offset[0] as u64 + i0,
                        offset[1] as u64 + i1,
                        offset[2] as u64 + i2,
                        offset[3] as u64 + i3,
                    ];
                    out.push((0..4).map(|d| index[d] * strides[d]).sum());
                }
            }
        }
    }
    out
}

/// Whether two element lists share an element.
pub fn share_an_element(a: &[u64], b: &[u64]) -> bool {
    let set: HashSet<u64> = a.iter().copied().collect();
    b.iter().any(|e| set.contains(e))
}

/// One argument of a task as the oracle sees it.
pub struct Touch {
    pub elements: Vec<u64>,
    pub writes: bool,
}

/// Whether two tasks' accesses conflict: a shared element, one side writing.
pub fn conflict(a: &[Touch], b: &[Touch]) -> bool {
    a.iter().any(|x| {
        b.iter()
            .any(|y| (x.writes || y.writes) && share_an_element(&x.elements, &y.elements))
    })
}

/// Whether a task's own arguments conflict with each other (what a valid
/// task never does).
pub fn conflicts_with_itself(args: &[Touch]) -> bool {
    args.iter()
        .enumerate()
        .any(|(i, a)| conflict(std::slice::from_ref(a), &args[..i]))
}

const NONE: u32 = u32::MAX;

/// [`conflicts_with_itself`] over elements `0 .. space` for many tasks in a
/// row, with marks in place of hash sets (for the large stress runs).
pub struct SelfCheck {
    /// Per element: the check that last marked it, and whether an argument
    /// of that check writes it.
    marks: Vec<(u32, bool)>,
    check: u32,
}

impl SelfCheck {
    pub fn new(space: usize) -> Self {
        SelfCheck {
            marks: vec![(0, false); space],
            check: 0,
        }
    }

    /// Whether an element is touched by two of `args` and written by one.
    /// Each argument lists each of its elements once.
    pub fn conflicts_with_itself(&mut self, args: &[Touch]) -> bool {
        self.check += 1;
        let check = self.check;
        for a in args {
            for &e in &a.elements {
                let (last, written) = &mut self.marks[e as usize];
                if *last == check {
                    if *written || a.writes {
                        return true;
                    }
                } else {
                    (*last, *written) = (check, false);
                }
                *written |= a.writes;
            }
        }
        false
    }
}

/// A sweep over tasks in program order, element by element: for each
/// element it remembers the last task that wrote it and the tasks that read
/// it since. A task must follow the last writer of every element it touches
/// and, where it writes, every reader since that writer.
///
/// These direct predecessors are enough to check a schedule: if every task
/// starts after its direct predecessors end, it starts after every earlier
/// task it conflicts with (each such pair is linked by a chain of direct
/// predecessors along the shared element's accesses, and `end[u] <
/// start[w] <= end[w]` carries along the chain).
pub struct Sweep {
    writer: Vec<u32>,
    /// Head of the element's list of readers in `nodes`.
    readers: Vec<u32>,
    /// (task, next) links of the readers' lists.
    nodes: Vec<(u32, u32)>,
    /// Elements touched, to reset them.
    touched: Vec<u64>,
    /// Per task, the last task whose predecessors listed it (dedup).
    seen: Vec<u32>,
    next: u32,
}

impl Sweep {
    /// A sweep over elements `0 .. space`.
    pub fn new(space: usize) -> Self {
        Sweep {
            writer: vec![NONE; space],
            readers: vec![NONE; space],
            nodes: Vec::new(),
            touched: Vec::new(),
            seen: Vec::new(),
            next: 0,
        }
    }

    /// Forgets every task (cheaper than a new sweep when few elements were
    /// touched).
    pub fn reset(&mut self) {
        for &e in &self.touched {
            self.writer[e as usize] = NONE;
            self.readers[e as usize] = NONE;
        }
        self.touched.clear();
        self.nodes.clear();
        self.seen.clear();
        self.next = 0;
    }

    /// Adds the next task (numbered from 0 in program order) and returns
    /// the earlier tasks it must directly follow, in no particular order.
    pub fn task(&mut self, args: &[Touch]) -> Vec<u32> {
        let t = self.next;
        self.next += 1;
        self.seen.push(NONE);
        let mut out = Vec::new();
        let add = |u: u32, seen: &mut Vec<u32>, out: &mut Vec<u32>| {
            if u != t && seen[u as usize] != t {
                seen[u as usize] = t;
                out.push(u);
            }
        };
        for a in args {
            for &e in &a.elements {
                let e = e as usize;
                if self.writer[e] != NONE {
                    add(self.writer[e], &mut self.seen, &mut out);
                }
                if a.writes {
                    let mut n = self.readers[e];
                    while n != NONE {
                        let (u, next) = self.nodes[n as usize];
                        add(u, &mut self.seen, &mut out);
                        n = next;
                    }
                }
            }
        }
        for a in args {
            for &e in &a.elements {
                let i = e as usize;
                if self.writer[i] == NONE && self.readers[i] == NONE {
                    self.touched.push(e);
                }
                if a.writes {
                    self.writer[i] = t;
                    self.readers[i] = NONE;
                } else {
                    self.nodes.push((t, self.readers[i]));
                    self.readers[i] = self.nodes.len() as u32 - 1;
                }
            }
        }
        out
    }
}
