//! What the host tests share: an emulated AICore, the host's buffers and
//! the calls CANN makes.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use device_runtime::ascend::Handshake;
use host_tools::table::Arena;
use wsp_aicpu::*;

pub const ADD: u32 = wsp_ffi::WspKernelId_WSP_KERNEL_ADD;
pub const CORES: usize = 4;
pub const WORDS: usize = 0x500 / 4;

pub fn word(addr: usize) -> &'static AtomicU32 {
    // SAFETY: test memory that outlives the scoped threads, 4-aligned.
    unsafe { AtomicU32::from_ptr(addr as *mut u32) }
}

/// CANN's AICore side for core `idx` (see docs/ASCEND.md): bring-up, then
/// tasks until the exit id. Returns the tasks it ran.
pub fn aicore(idx: usize, record: usize, regs: usize) -> u32 {
    aicore_with(
        idx,
        record,
        regs,
        &|kernel, args| match wsp_ffi::lookup(kernel) {
            // SAFETY: the AICPU issued these arguments under its contract.
            Some(info) => unsafe { info.invoke(args) }.unwrap_or(wsp_ffi::WSP_KERNEL_REJECTED),
            None => wsp_ffi::WSP_KERNEL_REJECTED,
        },
    )
}

/// As [`aicore`], with `run` in place of the kernels.
pub fn aicore_with(
    idx: usize,
    record: usize,
    regs: usize,
    run: &dyn Fn(u32, &wsp_ffi::WspKernelArgs) -> u64,
) -> u32 {
    while word(record).load(Ordering::Acquire) == 0 {
        std::thread::yield_now();
    }
    // SAFETY: `task` @8 is 8-aligned; written before aicpu_ready.
    let task =
        unsafe { AtomicU64::from_ptr((record + 8) as *mut u64) }.load(Ordering::Acquire) as usize;
    word(record + 20).store(idx as u32, Ordering::Relaxed);
    word(record + 28).store(1, Ordering::Release);
    while word(record + 24).load(Ordering::Acquire) == 0 {
        std::thread::yield_now();
    }
    let (data_main, cond) = (word(regs + 0xA0), word(regs + 0x4C8));
    cond.store(0xFFFF_FFFF, Ordering::Release);
    word(record + 4).store(idx as u32 + 1, Ordering::Release);
    let (mut last, mut ran) = (0x7FFF_FFFD, 0);
    loop {
        let id = data_main.load(Ordering::Acquire);
        if id == 0x7FFF_FFF0 {
            cond.store(0xFFFF_FFFE, Ordering::Release);
            return ran;
        }
        if id == last || id == 0x7FFF_FFFD {
            std::thread::yield_now();
            continue;
        }
        cond.store(id, Ordering::Release);
        let buffer = task + (id as usize & 1) * 512;
        // SAFETY: written by the AICPU before DATA_MAIN_BASE (Acquire above);
        // function_bin_addr @0, args @8, kernel_id @144, result @152.
        unsafe {
            let kernel = *((buffer + 144) as *const u32);
            let args = &*((buffer + 8) as *const wsp_ffi::WspKernelArgs);
            let result = run(kernel, args);
            *((buffer + 152) as *mut u64) = result;
        }
        cond.store(id | 0x8000_0000, Ordering::Release);
        last = id;
        ran += 1;
    }
}

pub fn error_text(a: &WspAicpuArgs) -> String {
    String::from_utf8_lossy(&a.result.error[..a.result.error_len as usize]).into_owned()
}

pub struct Host {
    pub table: Vec<u8>,
    pub arena: Arena,
    pub launch: Vec<u8>,
    pub kernels: Vec<u64>,
    pub kinds: Vec<u32>,
    pub handshakes: Vec<Handshake>,
    pub regs: Vec<[AtomicU32; WORDS]>,
    pub bases: Vec<u64>,
}

impl Host {
    /// A launch of `table` over `arena` on 2 cube + 2 vector emulated
    /// AICores (zeroed registers and handshake records), with ADD the one
    /// kernel built in.
    pub fn new(table: Vec<u8>, arena: Arena, launch: Vec<u8>) -> Host {
        let mut kernels = vec![0u64; 64];
        kernels[ADD as usize] = 0x1000; // any nonzero "function address"
        let regs: Vec<[AtomicU32; WORDS]> = (0..CORES)
            .map(|_| [const { AtomicU32::new(0) }; WORDS])
            .collect();
        let bases = regs.iter().map(|r| r.as_ptr() as u64).collect();
        Host {
            table,
            arena,
            launch,
            kernels,
            kinds: vec![
                WSP_CORE_CUBE,
                WSP_CORE_CUBE,
                WSP_CORE_VECTOR,
                WSP_CORE_VECTOR,
            ],
            handshakes: vec![Handshake::default(); CORES],
            regs,
            bases,
        }
    }

    pub fn args(&mut self) -> Box<WspAicpuArgs> {
        Box::new(WspAicpuArgs {
            magic: WSP_AICPU_MAGIC,
            version: WSP_AICPU_VERSION,
            size: std::mem::size_of::<WspAicpuArgs>() as u32,
            aicpu_threads: 3,
            table: self.table.as_ptr(),
            table_len: self.table.len() as u64,
            arena: self.arena.bytes.as_mut_ptr(),
            arena_len: self.arena.bytes.len() as u64,
            launch: self.launch.as_ptr(),
            launch_len: self.launch.len() as u64,
            kernel_addrs: self.kernels.as_ptr(),
            num_kernels: self.kernels.len() as u32,
            num_cores: CORES as u32,
            core_kinds: self.kinds.as_ptr(),
            handshakes: self.handshakes.as_mut_ptr(),
            num_regs: self.bases.len() as u32,
            timeout_us: 0,
            result: WspAicpuResult {
                status: -1,
                error_len: 0,
                tasks: 0,
                wall_ticks: 0,
                ticks_per_second: 0,
                error: [0; WSP_AICPU_ERROR_LEN],
            },
        })
    }
}

pub fn kernel_args(args: &mut WspAicpuArgs, regs: *const u64) -> WspCannKernelArgs {
    WspCannKernelArgs {
        unused0: [0; 5],
        device_args: 0,
        runtime_args: args,
        regs,
        ffts_base_addr: 0,
        profiling: [0; 6],
        log_level: 0,
        reserved0: 0,
        enable_profiling_flag: 0,
        reserved1: 0,
        device_wall_data_base: 0,
    }
}

pub fn init(k: &mut WspCannKernelArgs) -> i32 {
    // SAFETY: `k` is a KernelArgs whose pointers are the test's live memory.
    unsafe { DynTileFwkBackendKernelServerInit(k as *mut _ as *mut core::ffi::c_void) }
}

/// An AICore that comes up and then never acknowledges a task (it sees
/// each one and leaves it), but exits when told to. Returns 0.
pub fn aicore_never_acks(idx: usize, record: usize, regs: usize) -> u32 {
    while word(record).load(Ordering::Acquire) == 0 {
        std::thread::yield_now();
    }
    word(record + 20).store(idx as u32, Ordering::Relaxed);
    word(record + 28).store(1, Ordering::Release);
    while word(record + 24).load(Ordering::Acquire) == 0 {
        std::thread::yield_now();
    }
    let (data_main, cond) = (word(regs + 0xA0), word(regs + 0x4C8));
    cond.store(0xFFFF_FFFF, Ordering::Release);
    word(record + 4).store(idx as u32 + 1, Ordering::Release);
    while data_main.load(Ordering::Acquire) != 0x7FFF_FFF0 {
        std::thread::yield_now();
    }
    cond.store(0xFFFF_FFFE, Ordering::Release);
    0
}

/// A table of `n` adds of 16x16 tiles, C[i] = A[i] + B[i], with A and B
/// filled in its arena, and what C must hold after it (computed here, not
/// by the runtime).
pub struct Adds {
    pub table: Vec<u8>,
    pub arena: Arena,
    pub c: host_tools::table::TensorLayout,
    pub expected: Vec<f32>,
}

impl Adds {
    pub fn new(n: u32, scale: f32) -> Adds {
        use host_tools::table::{Arg, TableBuilder};
        use wsp_ffi::ArgAccess::{In, Out};
        let rows = 16 * n;
        let mut b = TableBuilder::new();
        let (ta, tb, tc) = (
            b.tensor("A", &[rows, 16]).unwrap(),
            b.tensor("B", &[rows, 16]).unwrap(),
            b.tensor("C", &[rows, 16]).unwrap(),
        );
        for i in 0..n {
            let t = |id, access| Arg::tile(id, access, 16 * i, 0, 16, 16);
            b.task(ADD, &[t(ta, In), t(tb, In), t(tc, Out)], &[])
                .unwrap();
        }
        let mut arena = Arena::zeroed(b.arena_size());
        let len = (rows * 16) as usize;
        let a: Vec<f32> = (0..len).map(|i| scale * i as f32).collect();
        let bv: Vec<f32> = (0..len).map(|i| 0.5 * i as f32).collect();
        arena.write_f32(b.layout(ta), &a);
        arena.write_f32(b.layout(tb), &bv);
        let expected = a.iter().zip(&bv).map(|(x, y)| x + y).collect();
        Adds {
            c: b.layout(tc).clone(),
            table: b.finish().unwrap(),
            arena,
            expected,
        }
    }

    /// The host side of one launch of this table on [`CORES`] fresh
    /// emulated cores (cube cores first); `launch`: the launch block.
    pub fn host(&self, launch: Vec<u8>) -> Host {
        Host::new(self.table.clone(), self.arena.clone(), launch)
    }
}

/// A launch block choosing `threads` scheduler threads.
pub fn launch_block(threads: u32) -> Vec<u8> {
    use device_runtime::abi::launch::{encode_block, LAUNCH_MAX};
    let mut launch = vec![0u8; LAUNCH_MAX];
    let n = encode_block(&[], threads, "", &mut launch).unwrap();
    launch.truncate(n);
    launch
}

/// How an emulated core behaves in [`serve`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum CoreMode {
    /// Runs the real kernels.
    Runs,
    /// Rejects every kernel.
    Rejects,
    /// Comes up, never acknowledges a task.
    NeverAcks,
    /// Never comes up (no thread answers its handshake).
    Absent,
}

/// CANN's server calls for one launch whose Init succeeded: the server on
/// `threads` threads while the cores behave as `modes` says. Returns the
/// servers' statuses and the tasks each core ran.
pub fn serve(
    host: &Host,
    k: &mut WspCannKernelArgs,
    threads: usize,
    modes: [CoreMode; CORES],
) -> (Vec<i32>, Vec<u32>) {
    let kp = k as *mut WspCannKernelArgs as usize;
    std::thread::scope(|s| {
        let cores: Vec<_> = (0..CORES)
            .filter(|&i| modes[i] != CoreMode::Absent)
            .map(|i| {
                let record = &host.handshakes[i] as *const Handshake as usize;
                let regs = host.regs[i].as_ptr() as usize;
                let mode = modes[i];
                s.spawn(move || match mode {
                    CoreMode::Runs => aicore(i, record, regs),
                    CoreMode::Rejects => {
                        aicore_with(i, record, regs, &|_, _| wsp_ffi::WSP_KERNEL_REJECTED)
                    }
                    _ => aicore_never_acks(i, record, regs),
                })
            })
            .collect();
        let servers: Vec<_> = (0..threads)
            // SAFETY: `k` outlives the scope; its pointers are `host`'s.
            .map(|_| {
                s.spawn(move || unsafe {
                    DynTileFwkBackendKernelServer(kp as *mut core::ffi::c_void)
                })
            })
            .collect();
        let statuses = servers.into_iter().map(|t| t.join().unwrap()).collect();
        let ran = cores.into_iter().map(|t| t.join().unwrap()).collect();
        (statuses, ran)
    })
}
