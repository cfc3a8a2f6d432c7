//! The AICPU program's entry points on the host, as CANN would call them:
//! Init on one thread, the server on three, and four emulated AICores
//! (threads following CANN's AICore side of the handshake, running the
//! real kernels). One run per process (the program's statics), so this
//! file holds one test that goes through its cases in order.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use device_runtime::abi::launch::{encode_block, LAUNCH_MAX};
use device_runtime::ascend::Handshake;
use host_tools::table::{Arena, Arg, TableBuilder};
use wsp_aicpu::*;
use wsp_ffi::ArgAccess::{In, Out};

const ADD: u32 = wsp_ffi::WspKernelId_WSP_KERNEL_ADD;
const CORES: usize = 4;
const WORDS: usize = 0x500 / 4;

fn word(addr: usize) -> &'static AtomicU32 {
    // SAFETY: test memory that outlives the scoped threads, 4-aligned.
    unsafe { AtomicU32::from_ptr(addr as *mut u32) }
}

/// CANN's AICore side for core `idx` (see docs/ASCEND.md): bring-up, then
/// tasks until the exit id. Returns the tasks it ran.
fn aicore(idx: usize, record: usize, regs: usize) -> u32 {
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
            let result = match wsp_ffi::lookup(kernel) {
                Some(info) => info.invoke(args).unwrap_or(wsp_ffi::WSP_KERNEL_REJECTED),
                None => wsp_ffi::WSP_KERNEL_REJECTED,
            };
            *((buffer + 152) as *mut u64) = result;
        }
        cond.store(id | 0x8000_0000, Ordering::Release);
        last = id;
        ran += 1;
    }
}

fn error_text(a: &WspAicpuArgs) -> String {
    String::from_utf8_lossy(&a.result.error[..a.result.error_len as usize]).into_owned()
}

struct Host {
    table: Vec<u8>,
    arena: Arena,
    launch: Vec<u8>,
    kernels: Vec<u64>,
    kinds: Vec<u32>,
    handshakes: Vec<Handshake>,
    regs: Vec<[AtomicU32; WORDS]>,
    bases: Vec<u64>,
}

impl Host {
    fn args(&mut self) -> Box<WspAicpuArgs> {
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

fn kernel_args(args: &mut WspAicpuArgs, regs: *const u64) -> WspCannKernelArgs {
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

fn init(k: &mut WspCannKernelArgs) -> i32 {
    // SAFETY: `k` is a KernelArgs whose pointers are the test's live memory.
    unsafe { DynTileFwkBackendKernelServerInit(k as *mut _ as *mut core::ffi::c_void) }
}

#[test]
fn init_refuses_bad_arguments_then_a_run_adds_on_emulated_aicores() {
    // A table of 8 adds of 16x16 tiles: C[i] = A[i] + B[i].
    let mut b = TableBuilder::new();
    let (ta, tb, tc) = (
        b.tensor("A", &[128, 16]).unwrap(),
        b.tensor("B", &[128, 16]).unwrap(),
        b.tensor("C", &[128, 16]).unwrap(),
    );
    for i in 0..8 {
        let t = |id, access| Arg::tile(id, access, 16 * i, 0, 16, 16);
        b.task(ADD, &[t(ta, In), t(tb, In), t(tc, Out)], &[])
            .unwrap();
    }
    let mut arena = Arena::zeroed(b.arena_size());
    let a: Vec<f32> = (0..128 * 16).map(|i| i as f32).collect();
    let bv: Vec<f32> = (0..128 * 16).map(|i| 0.5 * i as f32).collect();
    arena.write_f32(b.layout(ta), &a);
    arena.write_f32(b.layout(tb), &bv);
    let mut launch = vec![0u8; LAUNCH_MAX];
    let n = encode_block(&[], 2, "", &mut launch).unwrap();
    launch.truncate(n);
    let mut kernels = vec![0u64; 64];
    kernels[ADD as usize] = 0x1000; // any nonzero "function address"
    let regs: Vec<[AtomicU32; WORDS]> = (0..CORES)
        .map(|_| [const { AtomicU32::new(0) }; WORDS])
        .collect();
    let bases = regs.iter().map(|r| r.as_ptr() as u64).collect();
    let mut host = Host {
        table: b.finish().unwrap(),
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
    };

    // The server before Init refuses.
    // SAFETY: the server ignores its argument before Init.
    assert_eq!(
        unsafe { DynTileFwkBackendKernelServer(std::ptr::null_mut()) },
        WSP_AICPU_NOT_INITIALIZED
    );
    // SAFETY: null is refused.
    assert_eq!(
        unsafe { DynTileFwkBackendKernelServerInit(std::ptr::null_mut()) },
        WSP_AICPU_BAD_ARGS
    );

    // Bad arguments: a status and a text naming the cause, never a panic.
    type Case = (&'static str, fn(&mut WspAicpuArgs), i32, &'static str);
    let bad: [Case; 6] = [
        ("magic", |a| a.magic = 0, WSP_AICPU_BAD_ARGS, "bad magic"),
        ("version", |a| a.version = 9, WSP_AICPU_BAD_ARGS, "version"),
        (
            "table",
            |a| a.table_len = 10,
            WSP_AICPU_BAD_TABLE,
            "descriptor table",
        ),
        (
            "threads",
            |a| a.aicpu_threads = 1,
            WSP_AICPU_BAD_LAUNCH,
            "2 scheduler threads",
        ),
        (
            "kind",
            |a| a.num_cores = 200,
            WSP_AICPU_BAD_ARGS,
            "num_cores",
        ),
        (
            "handshakes",
            |a| a.handshakes = 0x48 as *mut Handshake,
            WSP_AICPU_BAD_ARGS,
            "64-byte aligned",
        ),
    ];
    for (what, spoil, status, text) in bad {
        let mut args = host.args();
        spoil(&mut args);
        let mut k = kernel_args(&mut args, host.bases.as_ptr());
        assert_eq!(init(&mut k), status, "{what}");
        assert_eq!(args.result.status, status, "{what}");
        assert!(
            error_text(&args).contains(text),
            "{what}: {}",
            error_text(&args)
        );
    }
    let mut args = host.args();
    args.launch = std::ptr::null();
    args.launch_len = 3;
    let mut k = kernel_args(&mut args, host.bases.as_ptr());
    assert_eq!(
        init(&mut k),
        WSP_AICPU_BAD_ARGS,
        "a null launch block with a length"
    );

    // The run.
    let mut args = host.args();
    let mut k = kernel_args(&mut args, host.bases.as_ptr());
    assert_eq!(init(&mut k), WSP_AICPU_OK, "{}", error_text(&args));
    let kp = &mut k as *mut WspCannKernelArgs as usize;
    let (statuses, ran) = std::thread::scope(|s| {
        let cores: Vec<_> = (0..CORES)
            .map(|i| {
                let record = &host.handshakes[i] as *const Handshake as usize;
                let regs = host.regs[i].as_ptr() as usize;
                s.spawn(move || aicore(i, record, regs))
            })
            .collect();
        let servers: Vec<_> = (0..3)
            // SAFETY: `k` outlives the scope; the server reads only statics.
            .map(|_| {
                s.spawn(move || unsafe {
                    DynTileFwkBackendKernelServer(kp as *mut core::ffi::c_void)
                })
            })
            .collect();
        let statuses: Vec<i32> = servers.into_iter().map(|t| t.join().unwrap()).collect();
        let ran: Vec<u32> = cores.into_iter().map(|t| t.join().unwrap()).collect();
        (statuses, ran)
    });
    assert_eq!(statuses, [WSP_AICPU_OK; 3]);
    assert_eq!(args.result.status, WSP_AICPU_OK, "{}", error_text(&args));
    assert_eq!(args.result.tasks, 8);
    assert_eq!(args.result.ticks_per_second, 1_000_000_000);
    assert_eq!(
        ran.iter().sum::<u32>(),
        8,
        "every task ran on an AICore: {ran:?}"
    );
    let c = host.arena.read_f32(b.layout(tc));
    let expected: Vec<f32> = (0..128 * 16).map(|i| 1.5 * i as f32).collect();
    assert_eq!(c, expected);
    for i in 0..CORES {
        assert_eq!(
            host.regs[i][0x18 / 4].load(Ordering::Relaxed),
            0xF,
            "core {i} closed"
        );
    }

    // A second Init in the same load is refused with a reason.
    let mut again = host.args();
    let mut k = kernel_args(&mut again, host.bases.as_ptr());
    assert_eq!(init(&mut k), WSP_AICPU_INTERNAL);
    assert!(
        error_text(&again).contains("one table per load"),
        "{}",
        error_text(&again)
    );
}
