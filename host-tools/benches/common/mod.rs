//! What more than one bench uses: the scheduling bench's graphs as
//! tables, and cores whose kernels are empty. (Each bench uses part.)
#![allow(dead_code)]

use std::hint::black_box;

use device_runtime::platform::{Clock, Completion, Platform};
use host_tools::shim::HostClock;
use host_tools::table::{Arg, TableBuilder};
use wsp_ffi::ArgAccess::{In, Out};
use wsp_ffi::{CoreKind, WspKernelArgs, WspKernelId_WSP_KERNEL_ADD as ADD};

/// Tasks of a fan-out round: 16 x 16 tiles (the largest tile a kernel
/// takes is 64 x 64).
pub const WIDTH: u32 = 256;

/// A finished table and its arena's size in bytes.
pub type Built = (Vec<u8>, usize);

fn add(b: &mut TableBuilder, x: Arg, y: Arg, z: Arg) {
    b.task(ADD, &[x, y, z], &[]).unwrap();
}

fn built(b: TableBuilder) -> Built {
    (b.finish().unwrap(), b.arena_size() as usize)
}

/// (a): `n` independent `add` tasks, each writing its own element.
pub fn independent(n: u32) -> Built {
    let mut b = TableBuilder::new();
    let x = b.tensor("x", &[1, 1]).unwrap();
    let out = b.tensor("out", &[n.div_ceil(1024), 1024]).unwrap();
    for i in 0..n {
        let z = Arg::tile(out, Out, i / 1024, i % 1024, 1, 1);
        let one = Arg::tile(x, In, 0, 0, 1, 1);
        add(&mut b, one, one, z);
    }
    built(b)
}

/// (b): a chain of `n` tasks, each reading the element the one before
/// wrote.
pub fn chain(n: u32) -> Built {
    let mut b = TableBuilder::new();
    let t = [
        b.tensor("a", &[1, 1]).unwrap(),
        b.tensor("b", &[1, 1]).unwrap(),
    ];
    let k = b.tensor("k", &[1, 1]).unwrap();
    for i in 0..n as usize {
        let (src, dst) = (t[i % 2], t[(i + 1) % 2]);
        let one = |t, access| Arg::tile(t, access, 0, 0, 1, 1);
        add(&mut b, one(src, In), one(k, In), one(dst, Out));
    }
    built(b)
}

/// (c): `rounds` rounds of [`WIDTH`] tasks reading X[j] and writing
/// Y[j], then one task reading all of Y and writing all of X.
pub fn fan(rounds: u32) -> Built {
    let mut b = TableBuilder::new();
    let x = b.tensor("x", &[16, 16]).unwrap();
    let y = b.tensor("y", &[16, 16]).unwrap();
    let k = b.tensor("k", &[16, 16]).unwrap();
    for _ in 0..rounds {
        for j in 0..WIDTH {
            let one = |t, access| Arg::tile(t, access, j / 16, j % 16, 1, 1);
            add(&mut b, one(x, In), one(k, In), one(y, Out));
        }
        let all = |t, access| Arg::tile(t, access, 0, 0, 16, 16);
        add(&mut b, all(y, In), all(k, In), all(x, Out));
    }
    built(b)
}

/// Cores whose kernels are empty: a launch completes at once. Their clock
/// is the shim's (the time-stamp counter where it is invariant).
pub struct EmptyCores {
    /// How many.
    pub cores: usize,
    /// One bit per core with a launch not yet polled.
    pub busy: u64,
    pub clock: HostClock,
}

impl Clock for EmptyCores {
    fn now(&self) -> u64 {
        self.clock.now()
    }
    fn ticks_per_second(&self) -> u64 {
        self.clock.ticks_per_second()
    }
    // Idles as the shim does: spins, then yields (without the yield, two
    // threads the OS put on one processor shared it in 4 ms slices).
    fn relax(&self) {
        self.clock.relax()
    }
    fn pause(&self) {
        self.clock.pause()
    }
}

impl Platform for EmptyCores {
    fn num_cores(&self) -> usize {
        self.cores
    }
    fn core_kind(&self, _: usize) -> CoreKind {
        CoreKind::Vector
    }
    unsafe fn launch(&mut self, core: usize, _: u32, args: &WspKernelArgs) -> bool {
        black_box(args);
        if self.busy & (1 << core) != 0 {
            return false;
        }
        self.busy |= 1 << core;
        true
    }
    fn poll(&mut self, core: usize) -> Option<Completion> {
        if self.busy & (1 << core) == 0 {
            return None;
        }
        self.busy &= !(1 << core);
        Some(Completion::Done { cycles: 0 })
    }
}

impl EmptyCores {
    /// The platforms of a run on `threads` scheduler threads of `cores`
    /// empty cores each, and each thread's run-wide core numbers.
    pub fn for_threads(
        threads: usize,
        cores: usize,
        clock: &HostClock,
    ) -> (Vec<EmptyCores>, Vec<Vec<usize>>) {
        let platforms = (0..threads)
            .map(|_| EmptyCores {
                cores,
                busy: 0,
                clock: clock.clone(),
            })
            .collect();
        let numbers = (0..threads)
            .map(|t| (t * cores..(t + 1) * cores).collect())
            .collect();
        (platforms, numbers)
    }
}
