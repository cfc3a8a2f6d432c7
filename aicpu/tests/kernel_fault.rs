//! A run whose AICores reject every kernel: the program reports the
//! runtime's error (naming task, kernel and core) with `WSP_AICPU_RUN`
//! and still shuts every core down. Its own process: the program's
//! statics are per process (launches after a failed one: relaunch.rs).

use std::sync::atomic::Ordering;

mod common;
use common::*;

use device_runtime::ascend::Handshake;
use host_tools::table::{Arena, Arg, TableBuilder};
use wsp_aicpu::*;
use wsp_ffi::ArgAccess::{In, Out};

#[test]
fn a_rejected_kernel_is_reported_with_task_kernel_and_core() {
    let mut b = TableBuilder::new();
    let (ta, tb, tc) = (
        b.tensor("A", &[64, 16]).unwrap(),
        b.tensor("B", &[64, 16]).unwrap(),
        b.tensor("C", &[64, 16]).unwrap(),
    );
    for i in 0..4 {
        let t = |id, access| Arg::tile(id, access, 16 * i, 0, 16, 16);
        b.task(ADD, &[t(ta, In), t(tb, In), t(tc, Out)], &[])
            .unwrap();
    }
    let mut host = Host::new(
        b.finish().unwrap(),
        Arena::zeroed(b.arena_size()),
        Vec::new(),
    );
    let mut args = host.args();
    args.aicpu_threads = 1;
    let mut k = kernel_args(&mut args, host.bases.as_ptr());
    assert_eq!(init(&mut k), WSP_AICPU_OK, "{}", error_text(&args));
    let kp = &mut k as *mut WspCannKernelArgs as usize;
    let status = std::thread::scope(|s| {
        for i in 0..CORES {
            let record = &host.handshakes[i] as *const Handshake as usize;
            let regs = host.regs[i].as_ptr() as usize;
            s.spawn(move || aicore_with(i, record, regs, &|_, _| wsp_ffi::WSP_KERNEL_REJECTED));
        }
        // SAFETY: `k` outlives the scope.
        s.spawn(move || unsafe { DynTileFwkBackendKernelServer(kp as *mut core::ffi::c_void) })
            .join()
            .unwrap()
    });
    assert_eq!(status, WSP_AICPU_RUN);
    assert_eq!(args.result.status, WSP_AICPU_RUN);
    let text = error_text(&args);
    assert!(
        text.starts_with(&format!(
            "kernel {ADD} (add) rejected the arguments of task "
        )) && text.contains(" on core "),
        "{text}"
    );
    for i in 0..CORES {
        assert_eq!(
            host.regs[i][0x18 / 4].load(Ordering::Relaxed),
            0xF,
            "core {i} closed"
        );
        assert_eq!(
            host.regs[i][0x4C8 / 4].load(Ordering::Relaxed),
            0xFFFF_FFFE,
            "core {i} exited"
        );
    }
}
