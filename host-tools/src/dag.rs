//! Random DAG tables for the scheduling tests (the shim's, under every
//! policy and several threads, and QEMU's), and the meaning of a table: its
//! tasks run one by one in table order.

use device_runtime::abi::Table;
use device_runtime::sched::{kernel_args, Arena};
use wsp_ffi::ArgAccess::{In, InOut, Out};
use wsp_ffi::{WspKernelId_WSP_KERNEL_ADD as ADD, WspKernelId_WSP_KERNEL_GEMM_TILE as GEMM};

use crate::rng::SplitMix64;
use crate::table::{Arena as Data, Arg, TableBuilder};

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
pub fn in_table_order(table: &[u8], data: &Data) -> Vec<u8> {
    let table = Table::parse(table).unwrap();
    let mut bytes = data.bytes.clone();
    let arena = Arena::new(&mut bytes);
    for (index, task) in table.tasks().iter().enumerate() {
        let args = kernel_args(&table, &arena, index as u32);
        let kernel = wsp_ffi::lookup(task.kernel_id.get()).unwrap();
        // SAFETY: the table is validated, so every view lies inside `bytes`,
        // which `arena` borrows mutably; tasks run one at a time.
        unsafe { kernel.invoke(&args) }.unwrap();
    }
    bytes
}
