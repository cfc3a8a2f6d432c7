//! Decode attention planned on the device: the `decode_plan` kernel picks
//! the host planner's chunk for the same lengths, and the program's final
//! states are bit-identical to the host-planned table's with that chunk,
//! on the shim and in semantic time; bad lengths end the run with a clear
//! error.

use device_runtime::sched::{RunError, RunOptions};
use host_tools::attention::device::{decode_program, device_decode_workload};
use host_tools::attention::workload::decode_workload;
use host_tools::attention::{choose_chunk, CostModel, DecodeData, DecodeShape, Plan};
use host_tools::semantic::run_semantic;
use host_tools::shim::{Shim, ShimError};
use host_tools::table::Arena;
use wsp_ffi::CoreKind;

fn shape(lengths: &[u32]) -> DecodeShape {
    DecodeShape {
        lengths: lengths.to_vec(),
        q_heads: 8,
        kv_heads: 2,
        d: 32,
        page: 16,
    }
}

const KINDS: [CoreKind; 6] = [
    CoreKind::Cube,
    CoreKind::Cube,
    CoreKind::Cube,
    CoreKind::Vector,
    CoreKind::Vector,
    CoreKind::Vector,
];

/// The final states (`out`) of a run of `w` in semantic time and on the
/// shim (asserted equal), and the run's task count.
fn run_both(w: &host_tools::workloads::Workload) -> (Vec<u8>, Arena, u64) {
    let mut semantic = w.arena.clone();
    let run = run_semantic(
        &w.table,
        &mut semantic.bytes,
        &KINDS,
        &RunOptions::default(),
    )
    .unwrap();
    let mut threads = w.arena.clone();
    let shim = Shim {
        cube_cores: 3,
        vector_cores: 3,
        ..Shim::default()
    };
    shim.run(&w.table, &mut threads.bytes).unwrap();
    let out = w.tensors.iter().find(|l| l.name == "out").unwrap();
    let bytes = |a: &Arena| {
        let at = out.arena_offset as usize;
        a.bytes[at..at + 4 * out.elements()].to_vec()
    };
    assert_eq!(
        bytes(&semantic),
        bytes(&threads),
        "semantic time and the shim differ"
    );
    let v = w.verify(&semantic);
    assert!(v.passed(), "{v}");
    (bytes(&semantic), semantic, run.stats.tasks)
}

#[test]
fn the_device_plans_the_hosts_chunk_and_matches_its_states_bit_for_bit() {
    // Lengths around page and chunk edges, and two long ones to split.
    for (lengths, cores) in [
        (vec![1, 5, 63, 64, 65, 200, 700, 1000], 3),
        (vec![1000, 3, 1000, 17], 8),
        (vec![40; 6], 2),
    ] {
        let data = DecodeData::build(shape(&lengths), 11).unwrap();
        let s = &data.shape;
        let chunk = choose_chunk(
            &s.lengths,
            s.kv_heads,
            cores,
            s.page,
            CostModel::of(s.group(), s.d).unwrap(),
        )
        .unwrap();
        let device = device_decode_workload("decode-device", &data, cores).unwrap();
        let (device_out, arena, device_tasks) = run_both(&device);
        // The plan the device wrote.
        let plan = device.tensors.iter().find(|l| l.name == "plan").unwrap();
        assert_eq!(arena.read_i32(plan), vec![chunk as i32], "{lengths:?}");
        // The host plan with that chunk: the same states, bit for bit,
        // and the same tasks but the planning one.
        let host_plan = Plan::with_chunk(s, chunk);
        let host = decode_workload("decode", &data, &host_plan).unwrap();
        let (host_out, _, host_tasks) = run_both(&host);
        assert!(device_out == host_out, "{lengths:?}: states differ");
        assert_eq!(device_tasks, host_tasks + 1, "{lengths:?}");
        if lengths == [1000, 3, 1000, 17] {
            // Split: the long requests have several chunks and merges.
            assert!(host_plan.merges() >= 2, "chunk {chunk}");
        }
    }
}

#[test]
fn bad_lengths_end_the_device_planned_run_clearly() {
    let data = DecodeData::build(shape(&[40, 17, 9]), 5).unwrap();
    let (mut w, t) = decode_program(&data, 2).unwrap();
    let table = w.finish().unwrap();
    let base = {
        let mut arena = Arena::zeroed(w.arena_size());
        arena.write_f32(w.layout(t.attn.q), &data.q);
        arena.write_f32(w.layout(t.attn.kv), &data.kv);
        arena.write_i32(w.layout(t.attn.meta), &data.meta);
        arena
    };
    let run = |lens: &[i32]| {
        let mut arena = base.clone();
        arena.write_i32(w.layout(t.attn.lens), lens);
        let e = Shim::default().run(&table, &mut arena.bytes).unwrap_err();
        match e {
            ShimError::Run(r) => *r,
            other => panic!("{other}"),
        }
    };
    // A length of 0: the planning kernel refuses it at run time.
    let e = run(&[40, 0, 9]);
    assert!(matches!(e, RunError::KernelRejected { .. }), "{e}");
    // A length past request 1's pages (2 of 16 tokens; its third table
    // entry is -1): the partial kernel finds no page at run time.
    let e = run(&[40, 33, 9]);
    assert!(
        matches!(e, RunError::KernelRejected { kernel_id: 7, .. }),
        "{e}"
    );
    // A length past the page table's width (3 pages): the partial breaks
    // the kernel's contract, refused when it is expanded.
    let e = run(&[49, 3, 9]);
    assert!(matches!(e, RunError::Expand { .. }), "{e}");
    assert!(e.to_string().contains("page table"), "{e}");
}

#[test]
fn sizes_the_device_planner_does_not_take_are_refused_before_the_run() {
    // decode_plan takes 1 ..= 4096 cores and pages of up to 65536 tokens:
    // the kernel would refuse the others only once the run reached it,
    // naming a scalar.
    let data = DecodeData::build(shape(&[40, 17, 9]), 3).unwrap();
    for (cores, why) in [
        (
            0,
            "0 cores: the device planner (decode_plan) takes 1 ..= 4096",
        ),
        (
            4097,
            "4097 cores: the device planner (decode_plan) takes 1 ..= 4096",
        ),
    ] {
        let e = device_decode_workload("decode-device", &data, cores)
            .err()
            .unwrap();
        assert!(e.to_string().contains(why), "{e}");
    }
    assert!(device_decode_workload("decode-device", &data, 4096).is_ok());
    let big_page = DecodeData::build(
        DecodeShape {
            page: 65537,
            d: 1,
            ..shape(&[3])
        },
        1,
    )
    .unwrap();
    let e = device_decode_workload("decode-device", &big_page, 8)
        .err()
        .unwrap();
    assert!(
        e.to_string()
            .contains("65537 tokens per page: the device planner (decode_plan) takes 1 ..= 65536"),
        "{e}"
    );
    // The decode layers plan on the device too.
    let p = host_tools::workloads::Params {
        m: 1,
        n: 1,
        k: 64,
        tile: 65537,
        seed: 1,
    };
    let e = host_tools::workloads::Workload::build("decode-layer-dense", p)
        .err()
        .unwrap();
    assert!(e.to_string().contains("65537 tokens per page"), "{e}");
}

#[test]
fn the_device_program_refuses_data_its_check_refuses() {
    // 65536 requests of 65536 query and KV heads: the parts' 2^32
    // (request, KV head) groups once overflowed u32 in decode_program,
    // which did not check its data; now the shape's check names the
    // 65536 x 65536 = 4294967296 query rows.
    let data = DecodeData {
        shape: DecodeShape {
            lengths: vec![1; 65536],
            q_heads: 65536,
            kv_heads: 65536,
            d: 1,
            page: 1,
        },
        pages: 65536,
        width: 1,
        q: vec![],
        kv: vec![],
        meta: vec![],
    };
    let e = decode_program(&data, 8).err().unwrap().to_string();
    assert!(e.contains("4294967296 query rows"), "{e}");
    // A page table edited to u32::MAX pages of 128 tokens (one chunk
    // each: min_chunk(128) = 128) and a group of 16: 16 x (2^32 - 1)
    // rows of partial states once overflowed; the metadata is refused.
    let mut data = DecodeData::build(
        DecodeShape {
            q_heads: 16,
            kv_heads: 1,
            page: 128,
            ..shape(&[40])
        },
        1,
    )
    .unwrap();
    data.width = u32::MAX;
    let e = decode_program(&data, 8).err().unwrap().to_string();
    assert!(
        e.contains("metadata of 2 elements, expected 8589934590"),
        "{e}"
    );
}

#[test]
fn a_cost_past_the_planners_32_bit_halves_fails_the_program() {
    use host_tools::attention::device::{plan_call, AttnDims};
    use host_tools::program::Workload as Program;
    let dims = |group, d| AttnDims {
        batch: 1,
        kv_heads: 1,
        group,
        d,
        page: 16,
        pool: 32,
        width: 1,
        most: 1,
    };
    let program = |dims: &AttnDims| {
        let mut w = Program::new();
        let lens = w.tensor_i32("lens", &[1, 1]).unwrap();
        let plan = w.tensor_i32("plan", &[1, 1]).unwrap();
        plan_call(&mut w, dims, lens, plan, 8);
        w.finish()
    };
    assert!(program(&dims(4, 32)).is_ok());
    // G = D = 2^16: an item costs 4 G D + 4 G = 2^34 + 2^18 cycles, past
    // the 32 bits the kernel's scalar gives it (once silently cut).
    let e = program(&dims(1 << 16, 1 << 16)).unwrap_err().to_string();
    assert!(e.contains("decode_plan") && e.contains("32-bit"), "{e}");
}

#[test]
fn a_head_dimension_whose_states_pass_u32_fails_the_program() {
    use host_tools::attention::device::{attention_calls, AttnDims, AttnTensors};
    use host_tools::program::{Expr, Workload as Program};
    let program = |d: u32| {
        let mut w = Program::new();
        let mut t = |name: &str| w.tensor(name, &[1, 1]).unwrap();
        let (q, kv, out, parts) = (t("q"), t("kv"), t("out"), t("parts"));
        let meta = w.tensor_i32("meta", &[1, 1]).unwrap();
        let lens = w.tensor_i32("lens", &[1, 1]).unwrap();
        let tensors = AttnTensors {
            q,
            kv,
            meta,
            out,
            parts,
            lens,
        };
        let dims = AttnDims {
            batch: 1,
            kv_heads: 1,
            group: 1,
            d,
            page: 16,
            pool: 32,
            width: 1,
            most: 1,
        };
        attention_calls(&mut w, &tensors, &dims, &Expr::Const(16));
        w.finish()
    };
    // D = u32::MAX: the state's D + 2 columns once overflowed u32.
    let e = program(u32::MAX).unwrap_err().to_string();
    assert!(
        e.contains(
            "call of attn_decode_partial: head dimension 4294967295: its state rows of \
             D + 2 values pass u32"
        ),
        "{e}"
    );
}
