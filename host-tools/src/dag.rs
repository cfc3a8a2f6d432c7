//! Random DAG tables for the scheduling tests (the shim's, under every
//! policy and several threads, and QEMU's), and the meaning of a table: its
//! tasks run one by one in table order.

use device_runtime::abi::Table;
use device_runtime::sched::{kernel_args, Arena};
use wsp_ffi::ArgAccess::{In, InOut, Out};
use wsp_ffi::{WspKernelId_WSP_KERNEL_ADD as ADD, WspKernelId_WSP_KERNEL_GEMM_TILE as GEMM};

use crate::rng::SplitMix64;
use crate::table::{Arena as Data, Arg, TableBuilder};
use zerocopy::IntoBytes;

/// A random DAG: GEMM (cube) and ADD (vector) tasks on random, partially
/// overlapping tiles of four tensors, so that every kind of dependency
/// (read-after-write, write-after-write, write-after-read) occurs.
pub fn random_dag(seed: u64, tasks: usize) -> (Vec<u8>, Data) {
    const N: u32 = 48;
    let mut rng = SplitMix64::new(seed);
    let mut b = TableBuilder::new();
    let t: Vec<_> = (0..4)
        .map(|i| b.tensor(&format!("t{i}"), &[N, N]).unwrap())
        .collect();
    let at = |rng: &mut SplitMix64, rows: u32, cols: u32| {
        let r = rng.below((N - rows + 1) as u64) as u32;
        let c = rng.below((N - cols + 1) as u64) as u32;
        (r, c)
    };
    for _ in 0..tasks {
        // Three distinct tensors, so that no task overlaps itself.
        let first = rng.below(4) as usize;
        let pick = [
            t[first],
            t[(first + 1) % 4],
            t[(first + 2 + rng.below(2) as usize) % 4],
        ];
        if rng.below(3) == 0 {
            let s = 8;
            let (ar, ac) = at(&mut rng, s, s);
            let (br, bc) = at(&mut rng, s, s);
            let (cr, cc) = at(&mut rng, s, s);
            let args = [
                Arg::tile(pick[0], In, ar, ac, s, s),
                Arg::tile(pick[1], In, br, bc, s, s),
                Arg::tile(pick[2], InOut, cr, cc, s, s),
            ];
            b.task(GEMM, &args, &[]).unwrap();
        } else {
            let (rows, cols) = [(8, 8), (16, 8), (8, 16)][rng.below(3) as usize];
            let (xr, xc) = at(&mut rng, rows, cols);
            let (yr, yc) = at(&mut rng, rows, cols);
            let (zr, zc) = at(&mut rng, rows, cols);
            let args = [
                Arg::tile(pick[0], In, xr, xc, rows, cols),
                Arg::tile(pick[1], In, yr, yc, rows, cols),
                Arg::tile(pick[2], Out, zr, zc, rows, cols),
            ];
            b.task(ADD, &args, &[]).unwrap();
        }
    }
    let table = b.finish().unwrap();
    let mut data = Data::zeroed(b.arena_size());
    for layout in b.layouts() {
        // Small values: sums stay finite and every bit is compared.
        let values: Vec<f32> = (0..layout.elements())
            .map(|_| rng.unit_f32() / 8.0)
            .collect();
        data.write_f32(layout, &values);
    }
    (table, data)
}

/// Runs every task in table order on this thread: the meaning of the table.
/// Panics on an invalid table, an arena shorter than its `arena_size`, or a
/// task on a scratch tensor (whose storage exists only during a run).
pub fn in_table_order(table: &[u8], data: &Data) -> Vec<u8> {
    let table = Table::parse(table).unwrap();
    let len = data.bytes.len();
    assert!(
        len as u64 >= table.arena_size(),
        "an arena of {len} bytes for a table that needs {}",
        table.arena_size()
    );
    // A buffer of words: its bytes are aligned for every dtype (4 bytes),
    // which a `Vec<u8>` does not promise.
    let mut words = vec![0u32; len.div_ceil(4)];
    let bytes = &mut words.as_mut_bytes()[..len];
    bytes.copy_from_slice(&data.bytes);
    let arena = Arena::new(bytes);
    for (index, task) in table.tasks().iter().enumerate() {
        let Some(args) = kernel_args(&table, &arena, index as u32) else {
            panic!("task {index} names a scratch tensor: only a run gives it storage");
        };
        let kernel = wsp_ffi::lookup(task.kernel_id.get()).unwrap();
        // SAFETY: `invoke` needs each view aligned, inside memory valid for
        // its access, and unshared during the call:
        // 1. Inside valid memory: `Table::parse` checked that every region
        //    lies inside its tensor and every arena tensor inside
        //    `arena_size` bytes, which `bytes` holds (asserted above;
        //    `kernel_args` refuses scratch tensors, which have none); `arena` borrows
        //    `bytes` mutably, so nothing else reaches them.
        // 2. Aligned: `bytes` starts on a `u32`, and validation keeps every
        //    tensor's offset a multiple of its element size (4).
        // 3. Unshared: tasks run one at a time on this thread, and
        //    validation refuses a task whose written region overlaps another
        //    of its own arguments.
        unsafe { kernel.invoke(&args) }.unwrap();
    }
    bytes.to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[should_panic(expected = "task 1 names a scratch tensor")]
    fn a_task_on_a_scratch_tensor_is_refused() {
        use crate::table::{Arg, TableBuilder};
        use wsp_ffi::ArgAccess::{In, Out};
        let mut b = TableBuilder::new();
        let x = b.tensor("x", &[1, 1]).unwrap();
        let y = b.tensor("y", &[1, 1]).unwrap();
        let s = b.scratch("s", &[1, 1]).unwrap();
        b.heap(64).unwrap();
        let one = |t, access| Arg::tile(t, access, 0, 0, 1, 1);
        let add = wsp_ffi::WspKernelId_WSP_KERNEL_ADD;
        b.task(add, &[one(x, In), one(x, In), one(y, Out)], &[])
            .unwrap();
        b.task(add, &[one(x, In), one(x, In), one(s, Out)], &[])
            .unwrap();
        in_table_order(&b.finish().unwrap(), &Data::zeroed(b.arena_size()));
    }

    #[test]
    #[should_panic(expected = "an arena of 0 bytes")]
    fn an_arena_shorter_than_the_table_is_refused() {
        let (table, _) = random_dag(1, 4);
        in_table_order(&table, &Data::zeroed(0));
    }
}
