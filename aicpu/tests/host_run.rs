//! The AICPU program's entry points on the host, as CANN would call them:
//! Init on one thread, the server on three, and four emulated AICores
//! (threads following CANN's AICore side of the handshake, running the
//! real kernels). The program's statics are per process, so this file
//! holds one test that goes through its cases in order.

use std::sync::atomic::Ordering;

mod common;
use common::*;

use device_runtime::abi::launch::{encode_block, LAUNCH_MAX};
use device_runtime::ascend::Handshake;
use host_tools::table::{Arena, Arg, TableBuilder};
use wsp_aicpu::*;
use wsp_ffi::ArgAccess::{In, Out};

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
    let mut host = Host::new(b.finish().unwrap(), arena, launch);

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

    // The next launch in the same load is accepted (its runs: relaunch.rs).
    let mut again = host.args();
    let mut k = kernel_args(&mut again, host.bases.as_ptr());
    assert_eq!(init(&mut k), WSP_AICPU_OK, "{}", error_text(&again));
}
