//! Many launches in one process load, as CANN makes them (one `dlopen`,
//! then Init and the server on n threads for every launch): a good table,
//! launches that fail in each way a launch can (a core that never
//! acknowledges, a core that never comes up, a kernel the cores reject),
//! an Init refused while a launch's server threads are still inside, then
//! the good table again and a different table. Each launch after a failed
//! one must be as clean as the first. One test: the program's statics are
//! per process.

use std::sync::atomic::Ordering;

mod common;
use common::CoreMode::{Absent, NeverAcks, Rejects, Runs};
use common::*;

use wsp_aicpu::*;

/// One launch of `adds` on `servers` server threads (`aicpu_threads` =
/// `servers`) with the scheduler threads of `launch`: Init must accept it;
/// returns the servers' statuses, the tasks each core ran, the result and
/// the arena's C.
fn launch(
    adds: &Adds,
    launch: Vec<u8>,
    servers: usize,
    timeout_us: u32,
    modes: [CoreMode; CORES],
) -> (Vec<i32>, Vec<u32>, WspAicpuResult, Vec<f32>) {
    let mut host = adds.host(launch);
    let mut args = host.args();
    args.aicpu_threads = servers as u32;
    args.timeout_us = timeout_us;
    let mut k = kernel_args(&mut args, host.bases.as_ptr());
    assert_eq!(init(&mut k), WSP_AICPU_OK, "{}", error_text(&args));
    let (statuses, ran) = serve(&host, &mut k, servers, modes);
    let c = host.arena.read_f32(&adds.c);
    (statuses, ran, args.result, c)
}

/// A launch that must succeed with every task of `adds` run on the cores
/// and C right.
fn good(adds: &Adds, tasks: u64, threads: u32, servers: usize, what: &str) {
    let (statuses, ran, result, c) = launch(adds, launch_block(threads), servers, 0, [Runs; 4]);
    let text = String::from_utf8_lossy(&result.error[..result.error_len as usize]).into_owned();
    assert_eq!(result.status, WSP_AICPU_OK, "{what}: {text}");
    assert_eq!(statuses, vec![WSP_AICPU_OK; servers], "{what}");
    assert_eq!(result.tasks, tasks, "{what}");
    assert_eq!(ran.iter().sum::<u32>() as u64, tasks, "{what}: {ran:?}");
    assert!(c == adds.expected, "{what}: C is wrong");
}

fn text(result: &WspAicpuResult) -> String {
    String::from_utf8_lossy(&result.error[..result.error_len as usize]).into_owned()
}

#[test]
fn launches_run_back_to_back_in_one_load_each_clean_after_a_failed_one() {
    let first = Adds::new(8, 1.0);
    good(&first, 8, 2, 3, "the first launch");
    good(&first, 8, 2, 3, "the same table again");

    // A refused Init between two launches closes the last one: the server
    // after it does nothing, and the next launch is as clean.
    let mut host = first.host(launch_block(2));
    let mut args = host.args();
    args.magic = 0;
    let mut k = kernel_args(&mut args, host.bases.as_ptr());
    assert_eq!(init(&mut k), WSP_AICPU_BAD_ARGS);
    // SAFETY: the server reads only the program's statics.
    assert_eq!(
        unsafe { DynTileFwkBackendKernelServer(std::ptr::null_mut()) },
        WSP_AICPU_NOT_INITIALIZED
    );
    good(&first, 8, 2, 3, "after a refused Init");

    // A vector core (the adds run on them) that never acknowledges its
    // task: the run ends with the runtime's error after its acknowledgement
    // bound (1 s), then waits out the kernel timeout (10 s) for the task
    // the core still holds before it shuts the cores down.
    let (statuses, _, result, _) =
        launch(&first, launch_block(2), 3, 0, [Runs, Runs, NeverAcks, Runs]);
    assert_eq!(result.status, WSP_AICPU_RUN, "{}", text(&result));
    assert!(text(&result).contains("core 2"), "{}", text(&result));
    assert!(statuses.contains(&WSP_AICPU_RUN), "{statuses:?}");
    good(&first, 8, 2, 3, "after a core that never acknowledged");

    // Every kernel rejected.
    let (_, _, result, _) = launch(&first, launch_block(2), 3, 0, [Rejects; 4]);
    assert_eq!(result.status, WSP_AICPU_RUN, "{}", text(&result));
    assert!(
        text(&result).contains("rejected the arguments of task"),
        "{}",
        text(&result)
    );
    good(&first, 8, 2, 3, "after a rejected kernel");

    // A core that never comes up; while thread 0 waits for it, an Init of
    // the next launch is refused and leaves the running launch alone.
    let mut host = first.host(launch_block(2));
    let mut args = host.args();
    // Long enough that the live cores come up and the early Init is made
    // while thread 0 still waits, on a loaded host too.
    args.timeout_us = 3_000_000;
    let mut k = kernel_args(&mut args, host.bases.as_ptr());
    assert_eq!(init(&mut k), WSP_AICPU_OK, "{}", error_text(&args));
    let absent = &host.handshakes[3] as *const _ as usize;
    let (statuses, refused) = std::thread::scope(|s| {
        let early = s.spawn(|| {
            // Thread 0 has arrived once it asks core 3 to come up.
            while word(absent).load(Ordering::Acquire) == 0 {
                std::thread::yield_now();
            }
            let mut next = first.host(launch_block(2));
            let mut next_args = next.args();
            let mut next_k = kernel_args(&mut next_args, next.bases.as_ptr());
            let status = init(&mut next_k);
            (status, next_args.result.status, error_text(&next_args))
        });
        let (statuses, _) = serve(&host, &mut k, 3, [Runs, Runs, Runs, Absent]);
        (statuses, early.join().unwrap())
    });
    assert_eq!(refused.0, WSP_AICPU_BUSY, "{}", refused.2);
    assert_eq!(refused.1, WSP_AICPU_BUSY);
    assert!(
        refused.2.contains("still running"),
        "the refusal says why: {}",
        refused.2
    );
    assert_eq!(args.result.status, WSP_AICPU_CORE, "{}", error_text(&args));
    assert!(
        error_text(&args).contains("core 3"),
        "{}",
        error_text(&args)
    );
    // The server thread that arrived first led the launch and reports the
    // core; the others (one cancelled, one past the launch's threads) return
    // OK. Which spawned thread arrives first is the OS's choice.
    let mut sorted = statuses.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        [WSP_AICPU_OK, WSP_AICPU_OK, WSP_AICPU_CORE],
        "{statuses:?}"
    );
    for i in 0..3 {
        assert_eq!(
            host.regs[i][0x18 / 4].load(Ordering::Relaxed),
            0xF,
            "core {i} closed"
        );
    }
    good(&first, 8, 2, 3, "after a core that never came up");

    // A different table, on other thread counts.
    let second = Adds::new(5, -2.0);
    good(
        &second,
        5,
        1,
        2,
        "a different table on one scheduler thread",
    );
    good(&second, 5, 4, 4, "a different table on four");
    good(&first, 8, 3, 3, "the first table once more");
}
