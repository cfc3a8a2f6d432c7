//! The platform against emulated AICores: one thread per core over a
//! heap-allocated register file and handshake records, following CANN's
//! AICore side as `docs/ASCEND.md` describes it (written from that
//! description, not from this module's code).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use wsp_ffi::{CoreKind, WspKernelArgs, WspTensorView};

use super::layout::{reg, Handshake, Payload, PayloadPair, PAYLOAD_SIZE};
use super::*;
use crate::mailbox::{next_id, EXIT};
use crate::platform::{Clock, Completion, Platform};

/// Nanoseconds since the clock was made.
#[derive(Clone, Copy)]
struct HostClock(Instant);

impl Clock for HostClock {
    fn now(&self) -> u64 {
        self.0.elapsed().as_nanos() as u64
    }
    fn ticks_per_second(&self) -> u64 {
        1_000_000_000
    }
    fn relax(&self) {
        std::thread::yield_now()
    }
}

const WORDS: usize = reg::SPAN / 4;
const LIMIT: u64 = 2_000_000_000; // 2 s in ns

/// The shared memory of `n` cores: register files (physical core `p` at
/// `regs[p]`), handshake records and payload buffers.
struct Machine {
    regs: Vec<[AtomicU32; WORDS]>,
    handshakes: Vec<Handshake>,
    payloads: Vec<PayloadPair>,
}

impl Machine {
    fn new(n: usize) -> Machine {
        Machine {
            regs: (0..n)
                .map(|_| [const { AtomicU32::new(0) }; WORDS])
                .collect(),
            handshakes: vec![Handshake::default(); n],
            payloads: (0..n).map(|_| [Payload::zeroed(); 2]).collect(),
        }
    }
    /// The register-base table: physical core `p` is core `n - 1 - p`
    /// (so a platform that used its own index would touch the wrong file).
    fn bases(&self) -> Vec<u64> {
        self.regs.iter().map(|r| r.as_ptr() as u64).collect()
    }
    fn links(&mut self) -> Vec<CoreLink> {
        let pp = self.payloads.as_mut_ptr();
        self.handshakes
            .iter_mut()
            .enumerate()
            // SAFETY: the machine outlives every use in a test; the emulator
            // accesses the records and registers atomically.
            .map(|(i, h)| unsafe { CoreLink::new(h, pp.add(i)) })
            .collect()
    }
    fn reg(&self, phys: usize, offset: usize) -> &AtomicU32 {
        &self.regs[phys][offset / 4]
    }
}

/// An address shared with an emulator thread.
#[derive(Clone, Copy)]
struct Addr(usize);

fn word(addr: usize) -> &'static AtomicU32 {
    // SAFETY: test memory that outlives the emulator threads (scoped), aligned.
    unsafe { AtomicU32::from_ptr(addr as *mut u32) }
}

/// What an emulated AICore saw: each task id and the buffer it read.
#[derive(Default)]
struct Seen {
    tasks: Mutex<Vec<(u32, usize)>>,
}

/// The AICore side of one core: bring-up, tasks until exit. `run` gives a
/// task's result from its kernel id and arguments.
fn aicore(
    idx: usize,
    phys: u32,
    record: Addr,
    regs: Addr,
    seen: &Seen,
    run: &(dyn Fn(u32, &WspKernelArgs) -> u64 + Sync),
) {
    let h = record.0;
    let field = |name: usize| word(h + name);
    while field(0).load(Ordering::Acquire) == 0 {
        std::thread::yield_now();
    }
    // SAFETY: `task` (@8) is 8-aligned in the record; written before aicpu_ready.
    let task = unsafe { AtomicU64::from_ptr((h + 8) as *mut u64) }.load(Ordering::Acquire) as usize;
    field(20).store(phys, Ordering::Relaxed);
    field(28).store(1, Ordering::Release);
    let asked = Instant::now();
    while field(24).load(Ordering::Acquire) == 0 {
        assert!(
            asked.elapsed() < Duration::from_secs(5),
            "core {idx}: never released from bring-up"
        );
        std::thread::yield_now();
    }
    let data_main = word(regs.0 + 0xA0);
    let cond = word(regs.0 + 0x4C8);
    assert_eq!(
        word(regs.0 + 0x18).load(Ordering::Acquire),
        0xE,
        "fast path open"
    );
    assert_eq!(data_main.load(Ordering::Acquire), 0x7FFF_FFFD, "AICPU idle");
    cond.store(0xFFFF_FFFF, Ordering::Release);
    field(16).store(0, Ordering::Relaxed);
    field(4).store(idx as u32 + 1, Ordering::Release);
    let mut last = 0x7FFF_FFFD;
    loop {
        let id = data_main.load(Ordering::Acquire);
        if id == 0x7FFF_FFF0 {
            cond.store(0xFFFF_FFFE, Ordering::Release);
            return;
        }
        if id == last || id == 0x7FFF_FFFD {
            std::thread::yield_now();
            continue;
        }
        cond.store(id, Ordering::Release);
        let buffer = task + (id as usize & 1) * PAYLOAD_SIZE;
        seen.tasks.lock().unwrap().push((id, buffer));
        // SAFETY: the AICPU wrote the buffer before DATA_MAIN_BASE (seen
        // with Acquire) and leaves it alone until FIN.
        let payload = unsafe { &mut *(buffer as *mut Payload) };
        assert_ne!(payload.function_bin_addr, 0);
        payload.result = run(payload.kernel_id, &payload.args);
        cond.store(id | 0x8000_0000, Ordering::Release);
        last = id;
    }
}

fn args(scalar: u64) -> WspKernelArgs {
    const EMPTY: WspTensorView = WspTensorView {
        addr: 0,
        rows: 0,
        cols: 0,
        row_stride: 0,
        dtype: 0,
    };
    WspKernelArgs {
        num_tensors: 0,
        num_scalars: 1,
        tensors: [EMPTY; 4],
        scalars: [scalar, 0, 0, 0],
    }
}

fn wait(p: &mut impl Platform, core: usize) -> Completion {
    let start = Instant::now();
    loop {
        if let Some(c) = p.poll(core) {
            return c;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "core {core} never finished"
        );
        std::thread::yield_now();
    }
}

const KINDS: [CoreKind; 2] = [CoreKind::Cube, CoreKind::Vector];
/// Kernel 1 at a fake address; kernel 0 and 2 are not built in.
const KERNELS: [u64; 3] = [0, 0x1000, 0];

/// `run` on each emulated core, `body` on the AICPU side with its links,
/// after a successful bring-up; then shut-down.
fn with_cores(
    run: &(dyn Fn(u32, &WspKernelArgs) -> u64 + Sync),
    body: impl FnOnce(&[CoreLink], &Machine, &[Seen; 2]),
) {
    let mut m = Machine::new(2);
    let bases: Vec<u64> = m.bases().into_iter().rev().collect();
    let mut links = m.links();
    let seen = [Seen::default(), Seen::default()];
    let clock = HostClock(Instant::now());
    std::thread::scope(|s| {
        for i in 0..2 {
            let record = Addr(&m.handshakes[i] as *const Handshake as usize);
            let phys = 1 - i;
            let regs = Addr(m.regs[i].as_ptr() as usize);
            let seen = &seen[i];
            s.spawn(move || aicore(i, phys as u32, record, regs, seen, run));
        }
        // SAFETY: `bases` are the machine's register files.
        unsafe { bring_up(&mut links, &bases, &clock, LIMIT) }.expect("bring-up");
        // A failed check still shuts the emulators down (or the scope
        // would wait for them forever), then fails the test.
        let checked =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&links, &m, &seen)));
        shut_down(&links, &clock, LIMIT).expect("shut-down");
        if let Err(panic) = checked {
            std::panic::resume_unwind(panic);
        }
    });
    for i in 0..2 {
        assert_eq!(m.reg(i, reg::FAST_PATH_ENABLE).load(Ordering::Relaxed), 0xF);
        assert_eq!(
            m.reg(i, reg::DATA_MAIN_BASE).load(Ordering::Relaxed),
            0x7FFF_FFFD
        );
        assert_eq!(m.reg(i, reg::COND).load(Ordering::Relaxed), 0xFFFF_FFFE);
        assert_eq!(m.handshakes[i].aicore_done, i as u32 + 1);
    }
}

#[test]
#[allow(clippy::needless_range_loop)] // `core` is a platform core number, not just an index.
fn runs_double_buffered_tasks_in_order_on_each_core() {
    let run = |k: u32, a: &WspKernelArgs| u64::from(k) * 1000 + a.scalars[0];
    with_cores(&run, |links, m, seen| {
        // SAFETY: the one platform over these cores.
        let mut p =
            unsafe { AscendPlatform::new(links, &KINDS, &KERNELS, HostClock(Instant::now())) }
                .unwrap();
        assert_eq!(p.depth(), 2);
        for core in 0..2 {
            let mut expected = std::collections::VecDeque::new();
            for t in 0..7u64 {
                // SAFETY: the arguments name no memory.
                while !unsafe { p.launch(core, 1, &args(t)) } {
                    if let Some(c) = p.poll(core) {
                        assert_eq!(Some(c), expected.pop_front());
                    }
                    std::thread::yield_now();
                }
                expected.push_back(Completion::Done { cycles: 1000 + t });
            }
            while let Some(e) = expected.pop_front() {
                assert_eq!(wait(&mut p, core), e);
            }
            let tasks = seen[core].tasks.lock().unwrap().clone();
            let first = &m.payloads[core] as *const PayloadPair as usize;
            assert_eq!(tasks.len(), 7);
            for (n, &(id, buffer)) in tasks.iter().enumerate() {
                assert_eq!(id, n as u32 + 1, "ids count from 1 per core");
                assert_eq!(buffer, first + (id as usize & 1) * PAYLOAD_SIZE);
            }
        }
    });
}

#[test]
fn a_task_is_reported_only_after_fin_and_the_next_waits_for_ack() {
    let gate = AtomicBool::new(false);
    let run = |_: u32, a: &WspKernelArgs| {
        if a.scalars[0] == 1 {
            while !gate.load(Ordering::Acquire) {
                std::thread::yield_now();
            }
        }
        a.scalars[0]
    };
    with_cores(&run, |links, m, _| {
        // SAFETY: the one platform over these cores.
        let mut p =
            unsafe { AscendPlatform::new(links, &KINDS, &KERNELS, HostClock(Instant::now())) }
                .unwrap();
        // Core 0 is physical core 1.
        let cond = m.reg(0, reg::COND);
        // SAFETY: the arguments name no memory.
        assert!(unsafe { p.launch(0, 1, &args(1)) });
        while cond.load(Ordering::Acquire) != 1 {
            std::thread::yield_now();
        }
        assert_eq!(p.poll(0), None, "acknowledged, not finished");
        assert!(p.can_queue(0), "an acknowledged task lets the next queue");
        // SAFETY: as above.
        assert!(unsafe { p.launch(0, 1, &args(2)) });
        assert!(!p.can_queue(0), "two tasks at most");
        // SAFETY: as above.
        assert!(!unsafe { p.launch(0, 1, &args(3)) }, "a third is refused");
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(p.poll(0), None, "still running");
        gate.store(true, Ordering::Release);
        assert_eq!(wait(&mut p, 0), Completion::Done { cycles: 1 });
        assert_eq!(wait(&mut p, 0), Completion::Done { cycles: 2 });
    });
}

#[test]
fn ids_wrap_before_the_reserved_values_keeping_buffer_parity() {
    let run = |_: u32, a: &WspKernelArgs| a.scalars[0];
    with_cores(&run, |links, m, seen| {
        // SAFETY: the one platform over these cores.
        let mut p =
            unsafe { AscendPlatform::new(links, &KINDS, &KERNELS, HostClock(Instant::now())) }
                .unwrap();
        // As if task EXIT - 3 had run and finished on core 1.
        p.set_last_id(1, EXIT - 3);
        m.reg(1, reg::COND)
            .store((EXIT - 3) | 0x8000_0000, Ordering::Release);
        for t in 0..4u64 {
            // SAFETY: the arguments name no memory.
            assert!(unsafe { p.launch(1, 1, &args(t)) });
            assert_eq!(wait(&mut p, 1), Completion::Done { cycles: t });
        }
        let ids: Vec<u32> = seen[1]
            .tasks
            .lock()
            .unwrap()
            .iter()
            .map(|&(id, _)| id)
            .collect();
        assert_eq!(ids, [EXIT - 2, EXIT - 1, 2, 3]);
        let first = &m.payloads[1] as *const PayloadPair as usize;
        let buffers: Vec<usize> = seen[1]
            .tasks
            .lock()
            .unwrap()
            .iter()
            .map(|&(_, b)| (b - first) / PAYLOAD_SIZE)
            .collect();
        assert_eq!(buffers, [0, 1, 0, 1], "buffers alternate across the wrap");
        assert_eq!(next_id(EXIT - 1), 2);
    });
}

#[test]
fn kernels_not_built_in_and_rejections_are_reported_in_order() {
    let run = |_: u32, a: &WspKernelArgs| {
        if a.scalars[0] == 9 {
            wsp_ffi::WSP_KERNEL_REJECTED
        } else {
            5
        }
    };
    with_cores(&run, |links, _, seen| {
        // SAFETY: the one platform over these cores.
        let mut p =
            unsafe { AscendPlatform::new(links, &KINDS, &KERNELS, HostClock(Instant::now())) }
                .unwrap();
        // SAFETY: the arguments name no memory.
        unsafe {
            assert!(p.launch(0, 1, &args(0)));
            while !p.can_queue(0) {
                std::thread::yield_now();
            }
            assert!(p.launch(0, 2, &args(0)), "address 0: not built in");
        }
        assert_eq!(wait(&mut p, 0), Completion::Done { cycles: 5 });
        assert_eq!(wait(&mut p, 0), Completion::Rejected);
        // SAFETY: as above.
        unsafe {
            assert!(p.launch(0, 77, &args(0)), "beyond the table: not built in");
            assert!(p.launch(0, 1, &args(9)));
        }
        assert_eq!(wait(&mut p, 0), Completion::Rejected);
        assert_eq!(
            wait(&mut p, 0),
            Completion::Rejected,
            "the kernel's own rejection"
        );
        assert_eq!(
            seen[0].tasks.lock().unwrap().len(),
            2,
            "unbuilt kernels never reach the core"
        );
    });
}

#[test]
fn a_core_that_never_answers_bring_up_is_named_within_the_bound() {
    let mut m = Machine::new(3);
    let bases = m.bases();
    let mut links = m.links();
    let clock = HostClock(Instant::now());
    let seen = [Seen::default(), Seen::default()];
    // 500 ms: cores 0 and 2, threads started just now, must answer both
    // stages within it even when the host stops them for a moment.
    let limit = 500_000_000;
    std::thread::scope(|s| {
        // Cores 0 and 2 answer; core 1 never does.
        for (i, seen) in [0, 2].into_iter().zip(&seen) {
            let record = Addr(&m.handshakes[i] as *const Handshake as usize);
            let regs = Addr(m.regs[i].as_ptr() as usize);
            s.spawn(move || aicore(i, i as u32, record, regs, seen, &|_, _| 0));
        }
        let start = Instant::now();
        // SAFETY: `bases` are the machine's register files.
        let e = unsafe { bring_up(&mut links, &bases, &clock, limit) }.unwrap_err();
        assert_eq!(
            e,
            CoreError::Timeout {
                core: 1,
                stage: Stage::RegsReady,
                waited_ticks: limit
            }
        );
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "bounded: {:?}",
            start.elapsed()
        );
        assert!(e.to_string().starts_with("core 1: bring-up"), "{e}");
        // The cores that answered finished their bring-up all the same, so
        // the shut-down releases them; core 1 is reported as never up.
        assert_eq!(m.handshakes[2].aicore_done, 3, "core 2 came up past core 1");
        let e = shut_down(&links, &clock, limit).unwrap_err();
        assert_eq!(e, CoreError::NotUp { core: 1 });
    });
    for i in [0, 2] {
        assert_eq!(m.reg(i, reg::FAST_PATH_ENABLE).load(Ordering::Relaxed), 0xF);
        assert_eq!(
            m.reg(i, reg::COND).load(Ordering::Relaxed),
            0xFFFF_FFFE,
            "core {i} exited"
        );
    }
}

#[test]
fn a_bad_physical_id_and_a_silent_exit_are_typed_errors() {
    let mut m = Machine::new(1);
    let mut links = m.links();
    let clock = HostClock(Instant::now());
    let bases = m.bases();
    let seen = Seen::default();
    std::thread::scope(|s| {
        let record = Addr(&m.handshakes[0] as *const Handshake as usize);
        let regs = Addr(m.regs[0].as_ptr() as usize);
        let seen = &seen;
        s.spawn(move || aicore(0, 5, record, regs, seen, &|_, _| 0));
        // SAFETY: as above.
        let e = unsafe { bring_up(&mut links, &bases, &clock, LIMIT) }.unwrap_err();
        assert_eq!(
            e,
            CoreError::BadPhysicalId {
                core: 0,
                id: 5,
                regs: 1
            }
        );
        assert_eq!(
            m.reg(0, reg::FAST_PATH_ENABLE).load(Ordering::Acquire),
            0,
            "never opened"
        );
        // Finish the emulator's bring-up by hand and let it exit.
        m.reg(0, reg::FAST_PATH_ENABLE)
            .store(0xE, Ordering::Release);
        m.reg(0, reg::DATA_MAIN_BASE)
            .store(0x7FFF_FFFD, Ordering::Release);
        word(record.0 + 24).store(1, Ordering::Release);
        while word(record.0 + 4).load(Ordering::Acquire) == 0 {
            std::thread::yield_now();
        }
        m.reg(0, reg::DATA_MAIN_BASE)
            .store(0x7FFF_FFF0, Ordering::Release);
    });
    // A core brought up whose AICore is gone: the exit wait is bounded.
    let mut links = m.links();
    m.reg(0, reg::COND).store(0xFFFF_FFFF, Ordering::Relaxed);
    m.handshakes[0].physical_core_id = 0;
    links[0] = {
        let mut l = links[0];
        // SAFETY: `bases[0]` is the machine's register file.
        l.set_regs_for_test(unsafe { regs::Regs::new(bases[0] as usize) });
        l
    };
    let e = shut_down(&links, &clock, 10_000_000).unwrap_err();
    assert!(
        matches!(
            e,
            CoreError::Timeout {
                core: 0,
                stage: Stage::Exit,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(
        m.reg(0, reg::FAST_PATH_ENABLE).load(Ordering::Relaxed),
        0xF,
        "closed anyway"
    );
}
