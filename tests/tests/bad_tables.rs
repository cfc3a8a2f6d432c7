//! Every class of bad descriptor table is refused with a typed error that
//! names the section, entry and field; nothing panics on any bytes.

use device_runtime::abi::{
    exact_table_len, Problem, Section, StreamOp, Table, TableError, TableHeader, TaskDesc,
    TensorArg, TensorDesc, HEADER_SIZE, MAX_EVENTS, MAX_STREAMS, MAX_TENSORS,
};
use host_tools::inspect::inspect;
use host_tools::rng::SplitMix64;
use host_tools::table::{seal, Arg, BuildError, TableBuilder};
use host_tools::workloads::{Params, Workload};
use zerocopy::FromBytes;

fn valid() -> Vec<u8> {
    Workload::build(
        "mlp",
        Params {
            m: 32,
            n: 64,
            k: 64,
            tile: 32,
            seed: 3,
        },
    )
    .unwrap()
    .table
}

/// Eight add tasks on streams 1 and 2, with ops: 0 record(1, e0) before
/// task 2, 1 wait(2, e0) before task 2, 2 record(2, e3) before task 6,
/// 3 wait(1, e3) before task 6.
fn with_streams() -> Vec<u8> {
    let mut b = TableBuilder::new();
    let x = b.tensor("X", &[8, 16]).unwrap();
    let y = b.tensor("Y", &[8, 16]).unwrap();
    for i in 0..8u32 {
        if i == 2 {
            b.record_event(1, 0).unwrap();
            b.wait_event(2, 0).unwrap();
        }
        if i == 6 {
            b.record_event(2, 3).unwrap();
            b.wait_event(1, 3).unwrap();
        }
        let args = [
            Arg::tile(x, wsp_ffi::ArgAccess::In, i, 0, 1, 16),
            Arg::tile(x, wsp_ffi::ArgAccess::In, i, 0, 1, 16),
            Arg::tile(y, wsp_ffi::ArgAccess::Out, i, 0, 1, 16),
        ];
        b.task_on(1 + i % 2, wsp_ffi::WspKernelId_WSP_KERNEL_ADD, &args, &[])
            .unwrap();
    }
    b.finish().unwrap()
}

/// As [`refused`], on the table with streams.
fn refused_streams(edit: impl FnOnce(&mut Vec<u8>)) -> TableError {
    let mut bytes = with_streams();
    edit(&mut bytes);
    seal(&mut bytes);
    Table::parse(&bytes).expect_err("the edited table must be refused")
}

fn op(bytes: &mut [u8], i: usize) -> &mut StreamOp {
    entry::<StreamOp>(bytes, |h| h.stream_ops.offset.get(), i)
}

fn header(bytes: &mut [u8]) -> &mut TableHeader {
    TableHeader::mut_from_prefix(bytes).unwrap().0
}

/// Entry `i` of the section `which` of type `T`.
fn entry<T: FromBytes + zerocopy::IntoBytes + zerocopy::KnownLayout>(
    bytes: &mut [u8],
    which: fn(&TableHeader) -> u32,
    i: usize,
) -> &mut T {
    let offset = which(header(bytes)) as usize + i * size_of::<T>();
    T::mut_from_prefix(&mut bytes[offset..]).unwrap().0
}

/// Applies `edit`, reseals the checksum, and returns the parse error.
fn refused(edit: impl FnOnce(&mut Vec<u8>)) -> TableError {
    let mut bytes = valid();
    edit(&mut bytes);
    seal(&mut bytes);
    let err = Table::parse(&bytes).expect_err("the edited table must be refused");
    let text = inspect(&bytes, true);
    assert!(
        text.contains(&format!("INVALID: {err}")),
        "inspect shows the error:\n{text}"
    );
    err
}

fn expect(err: TableError, section: Section, index: u32, field: &str) {
    assert_eq!(
        (err.section, err.index, err.field),
        (section, index, field),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains(section.name()) && text.contains(field),
        "message names section and field: {text}"
    );
}

#[test]
fn the_valid_table_parses() {
    let bytes = valid();
    let t = Table::parse(&bytes).unwrap();
    assert!(t.tasks().len() > 4);
    assert!(inspect(&bytes, false).contains("valid:"));
}

#[test]
fn wrong_magic() {
    let e = refused(|b| b[0] ^= 0x20);
    expect(e, Section::Header, 0, "magic");
    assert_eq!(e.problem, Problem::BadMagic);
}

#[test]
fn wrong_version() {
    for version in [1, 2, 4] {
        let e = refused(|b| header(b).abi_version.set(version));
        expect(e, Section::Header, 0, "abi_version");
        assert_eq!(e.problem, Problem::UnsupportedVersion { found: version });
    }
    // Version 1 and 2 tables have 64- and 72-byte headers: they are named
    // by their version, not as truncated.
    for (version, header_len) in [(1u32, 64), (2, 72)] {
        let mut old = valid()[..header_len].to_vec();
        old[8..12].copy_from_slice(&version.to_le_bytes());
        let e = Table::parse(&old).unwrap_err();
        assert_eq!(e.problem, Problem::UnsupportedVersion { found: version });
    }
}

#[test]
fn truncated() {
    let bytes = valid();
    for len in [
        0,
        10,
        HEADER_SIZE - 1,
        HEADER_SIZE,
        bytes.len() / 2,
        bytes.len() - 1,
    ] {
        let e = Table::parse(&bytes[..len]).unwrap_err();
        assert!(
            matches!(e.problem, Problem::Truncated { .. }),
            "len {len}: {e}"
        );
        assert_eq!(e.section, Section::Header);
    }
}

#[test]
fn checksum_mismatch() {
    let mut bytes = valid();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    let e = Table::parse(&bytes).unwrap_err();
    expect(e, Section::Header, 0, "checksum");
    assert!(matches!(e.problem, Problem::ChecksumMismatch { .. }));
}

#[test]
fn section_offsets_out_of_range() {
    let e = refused(|b| {
        let len = b.len() as u32;
        header(b).tasks.offset.set(len - 8);
    });
    expect(e, Section::Header, 0, "tasks");
    assert!(matches!(e.problem, Problem::Truncated { .. }), "{e}");
    let e = refused(|b| {
        let tasks = header(b).tasks.offset.get();
        header(b).args.offset.set(tasks);
    });
    assert!(
        matches!(
            e.problem,
            Problem::SectionOverlap {
                other: Section::Tasks
            }
        ),
        "{e}"
    );
    let e = refused(|b| header(b).tensors.offset.set(8));
    assert!(
        matches!(
            e.problem,
            Problem::SectionOverlap {
                other: Section::Header
            }
        ),
        "{e}"
    );
}

#[test]
fn unknown_kernel_id() {
    let e = refused(|b| {
        entry::<TaskDesc>(b, |h| h.tasks.offset.get(), 3)
            .kernel_id
            .set(99)
    });
    expect(e, Section::Tasks, 3, "kernel_id");
    assert_eq!(
        e.problem,
        Problem::UnknownKernel {
            id: 99,
            declared: false
        }
    );
    assert!(e.to_string().contains("unknown kernel id 99"));
    // Known to the registry but not declared by the table.
    let softmax = wsp_ffi::WspKernelId_WSP_KERNEL_SOFTMAX;
    let e = refused(|b| {
        let n = header(b).kernels.count.get();
        header(b).kernels.count.set(n - 1);
    });
    assert_eq!(
        e.problem,
        Problem::UnknownKernel {
            id: softmax,
            declared: true
        },
        "{e}"
    );
    // A kernel section entry the registry does not know.
    let e = refused(|b| {
        let off = header(b).kernels.offset.get() as usize;
        b[off..off + 4].copy_from_slice(&1234u32.to_le_bytes());
    });
    expect(e, Section::Kernels, 0, "kernel_id");
}

#[test]
fn region_outside_its_tensor() {
    // Arg 0 is A[0:32, 0:32] of a 32x64 tensor: start it at column 48.
    let e = refused(|b| entry::<TensorArg>(b, |h| h.args.offset.get(), 0).offset[1].set(48));
    expect(e, Section::Args, 0, "extent[1]");
    assert_eq!(
        e.problem,
        Problem::RegionOutside {
            dim: 1,
            end: 80,
            size: 64
        }
    );
}

#[test]
fn unsupported_dtype() {
    let e = refused(|b| {
        entry::<TensorDesc>(b, |h| h.tensors.offset.get(), 2)
            .dtype
            .set(7)
    });
    expect(e, Section::Tensors, 2, "dtype");
    assert_eq!(e.problem, Problem::UnsupportedDtype { dtype: 7 });
}

#[test]
fn tensors_that_alias_or_leave_the_arena() {
    let e = refused(|b| {
        let first = entry::<TensorDesc>(b, |h| h.tensors.offset.get(), 0)
            .arena_offset
            .get();
        entry::<TensorDesc>(b, |h| h.tensors.offset.get(), 1)
            .arena_offset
            .set(first + 64);
    });
    expect(e, Section::Tensors, 1, "arena_offset");
    assert_eq!(e.problem, Problem::Aliases { other: 0 });
}

/// A tensor larger than the whole arena is its shape's fault, whatever its
/// offset; the error names its offset, its size in bytes and the arena's.
/// (It was named on `arena_offset`, with the tensor's end as the offset's
/// value: `value 8192 outside [0, 1024]` for a tensor at offset 0.)
#[test]
fn a_tensor_larger_than_the_arena_is_named_on_its_shape() {
    // Tensor 0 is A, 32 x 64 f32 at offset 0: 8,192 bytes.
    let e = refused(|b| header(b).arena_size.set(1024));
    expect(e, Section::Tensors, 0, "shape");
    assert_eq!(
        e.problem,
        Problem::PastArena {
            offset: 0,
            bytes: 8192,
            arena: 1024
        }
    );
    assert!(
        e.to_string().contains(
            "the tensor is 8192 bytes (at offset 0), larger than the whole arena of 1024 bytes"
        ),
        "{e}"
    );
    // A shape of 2^32 - 1 rows: 2^32 - 1 rows of 256 bytes, far past the
    // arena (it was named on `arena_offset`, with that size as its value).
    let arena = Table::parse(&valid()).unwrap().arena_size();
    let e = refused(|b| {
        entry::<TensorDesc>(b, |h| h.tensors.offset.get(), 0).shape[0].set(u32::MAX);
    });
    expect(e, Section::Tensors, 0, "shape");
    let bytes = u32::MAX as u64 * 64 * 4;
    assert_eq!(
        e.problem,
        Problem::PastArena {
            offset: 0,
            bytes,
            arena
        }
    );
    assert!(
        e.to_string().contains(&format!(
            "the tensor is {bytes} bytes (at offset 0), larger than the whole arena of {arena} bytes"
        )),
        "{e}"
    );
}

/// A tensor that fits the arena but starts too late to end inside it is
/// its offset's fault; the error names the offset, the size in bytes and
/// the arena's (it gave the tensor's end as the offset's value).
#[test]
fn a_tensor_ending_past_the_arena_is_named_on_its_offset() {
    let bytes = valid();
    let t = Table::parse(&bytes).unwrap();
    let (last, range) = t
        .tensors()
        .iter()
        .enumerate()
        .filter_map(|(i, d)| Table::tensor_bytes(d).map(|r| (i, r)))
        .max_by_key(|(_, r)| r.end)
        .unwrap();
    let arena = range.end - 4;
    let e = refused(|b| header(b).arena_size.set(arena));
    expect(e, Section::Tensors, last as u32, "arena_offset");
    let len = range.end - range.start;
    assert_eq!(
        e.problem,
        Problem::PastArena {
            offset: range.start,
            bytes: len,
            arena
        }
    );
    assert!(
        e.to_string().contains(&format!(
            "the tensor's {len} bytes at offset {} end at {}, past the arena's {arena} bytes",
            range.start, range.end
        )),
        "{e}"
    );
}

/// An arena offset that is not a multiple of the element size is named as
/// misaligned (it was `value 2 outside [0, ARENA]`: 2 is inside that range).
#[test]
fn a_misaligned_tensor_offset_is_named_as_misaligned() {
    let e = refused(|b| {
        entry::<TensorDesc>(b, |h| h.tensors.offset.get(), 0)
            .arena_offset
            .set(2)
    });
    expect(e, Section::Tensors, 0, "arena_offset");
    assert_eq!(e.problem, Problem::Misaligned { value: 2, align: 4 });
    let text = e.to_string();
    assert!(
        text.contains("value 2 is misaligned: it must be a multiple of 4")
            && !text.contains("outside"),
        "{text}"
    );
}

#[test]
fn access_and_shape_contracts() {
    // The GEMM's C argument declared In instead of InOut.
    let e = refused(|b| {
        entry::<TensorArg>(b, |h| h.args.offset.get(), 2)
            .access
            .set(1)
    });
    expect(e, Section::Args, 2, "access");
    // A's tile made 16 rows tall while C stays 32.
    let e = refused(|b| entry::<TensorArg>(b, |h| h.args.offset.get(), 0).extent[0].set(16));
    expect(e, Section::Tasks, 0, "first_arg");
    assert!(matches!(e.problem, Problem::KernelContract(_)), "{e}");
}

/// `rmsnorm` on four row blocks of one tensor: tasks of one kernel, on
/// tiles of one shape, with one scalar (eps 1e-5).
fn rmsnorm_rows() -> Vec<u8> {
    let mut b = TableBuilder::new();
    let x = b.tensor("x", &[64, 32]).unwrap();
    let g = b.tensor("g", &[1, 32]).unwrap();
    let y = b.tensor("y", &[64, 32]).unwrap();
    for i in 0..4 {
        let args = [
            Arg::tile(x, wsp_ffi::ArgAccess::In, 16 * i, 0, 16, 32),
            Arg::tile(g, wsp_ffi::ArgAccess::In, 0, 0, 1, 32),
            Arg::tile(y, wsp_ffi::ArgAccess::Out, 16 * i, 0, 16, 32),
        ];
        let eps = 1e-5f32.to_bits() as u64;
        b.task(wsp_ffi::WspKernelId_WSP_KERNEL_RMSNORM, &args, &[eps])
            .unwrap();
    }
    b.finish().unwrap()
}

/// Validation checks a kernel's contract once for a run of tasks with the
/// same kernel, shapes and scalars: a task that breaks the contract after
/// tasks that kept it, by its shapes or only by a scalar, is refused all
/// the same, and named.
#[test]
fn a_contract_broken_after_tasks_that_kept_it() {
    let bytes = rmsnorm_rows();
    Table::parse(&bytes).expect("the rmsnorm table is valid");
    let task = |b: &mut Vec<u8>, i| *entry::<TaskDesc>(b, |h| h.tasks.offset.get(), i);
    // Task 3's y tile made 8 rows tall, while x stays 16.
    let mut edited = bytes.clone();
    let first = task(&mut edited, 3).first_arg.get() as usize;
    entry::<TensorArg>(&mut edited, |h| h.args.offset.get(), first + 2).extent[0].set(8);
    seal(&mut edited);
    let e = Table::parse(&edited).expect_err("a y tile of another height");
    expect(e, Section::Tasks, 3, "first_arg");
    assert!(matches!(e.problem, Problem::KernelContract(_)), "{e}");
    // Task 2's eps made negative: the same kernel and shapes as task 1.
    let mut edited = bytes.clone();
    entry::<TaskDesc>(&mut edited, |h| h.tasks.offset.get(), 2).scalars[0]
        .set((-1.0f32).to_bits() as u64);
    seal(&mut edited);
    let e = Table::parse(&edited).expect_err("a negative eps");
    expect(e, Section::Tasks, 2, "first_arg");
    assert!(matches!(e.problem, Problem::KernelContract(_)), "{e}");
    // Task 1's eps made 2e-5, still a valid eps: accepted.
    let mut edited = bytes;
    entry::<TaskDesc>(&mut edited, |h| h.tasks.offset.get(), 1).scalars[0]
        .set(2e-5f32.to_bits() as u64);
    seal(&mut edited);
    Table::parse(&edited).expect("another valid eps");
}

/// Random byte changes and truncations, half of them resealed. None
/// panics. A change the checksum was not recomputed over is always refused
/// (what a sealed CRC-32 implies for up to five changed bytes, short of a
/// 2^-32 chance that this fixed seed does not hit), and a table whose bytes
/// came out unchanged parses as the original. Resealed changes may be
/// valid tables; they parse or are refused, and `inspect` agrees.
#[test]
fn random_corruption_never_panics() {
    let good = valid();
    let mut rng = SplitMix64::new(7);
    let rounds = if cfg!(debug_assertions) {
        2_000
    } else {
        20_000
    };
    let (mut unsealed, mut resealed_refused) = (0, 0);
    for _ in 0..rounds {
        let mut bytes = good.clone();
        for _ in 0..=rng.below(4) {
            let i = rng.below(bytes.len() as u64) as usize;
            bytes[i] = rng.next_u64() as u8;
        }
        let resealed = rng.below(2) == 0;
        if resealed {
            seal(&mut bytes);
        }
        if rng.below(8) == 0 {
            bytes.truncate(rng.below(bytes.len() as u64) as usize);
        }
        let parsed = Table::parse(&bytes);
        let text = inspect(&bytes, true);
        match &parsed {
            Ok(_) => assert!(text.contains("valid:"), "{text}"),
            Err(e) => assert!(text.contains(&format!("INVALID: {e}")), "{text}"),
        }
        if resealed {
            resealed_refused += parsed.is_err() as u32;
        } else if bytes == good {
            assert!(parsed.is_ok(), "the unchanged table parses");
        } else {
            unsealed += 1;
            assert!(
                parsed.is_err(),
                "a change the checksum was not resealed over must be refused"
            );
        }
    }
    assert!(unsealed > rounds / 3, "{unsealed} unsealed changes");
    assert!(resealed_refused > 0, "resealed corruptions are caught too");
}

#[test]
fn a_task_writing_over_its_own_input() {
    // Task 4 is the first add: args 12 (Y in), 13 (R in), 14 (Z out). Point
    // its output at Y, over its own input.
    let e = refused(|b| {
        entry::<TensorArg>(b, |h| h.args.offset.get(), 14)
            .tensor
            .set(2)
    });
    expect(e, Section::Args, 14, "offset");
    assert_eq!(e.problem, Problem::ArgsOverlap { other: 12 });
}

#[test]
fn the_table_with_streams_parses() {
    let bytes = with_streams();
    let t = Table::parse(&bytes).unwrap();
    assert_eq!(t.stream_ops().len(), 4);
    assert_eq!(t.tasks()[3].stream.get(), 2);
}

#[test]
fn bad_streams_of_tasks() {
    fn task(b: &mut [u8]) -> &mut TaskDesc {
        entry(b, |h| h.tasks.offset.get(), 5)
    }
    let e = refused_streams(|b| task(b).stream.set(MAX_STREAMS as u32 + 1));
    expect(e, Section::Tasks, 5, "stream");
    assert!(matches!(e.problem, Problem::OutOfRange { max, .. } if max == MAX_STREAMS as u64));
    let e = refused_streams(|b| task(b).reserved.set(1));
    expect(e, Section::Tasks, 5, "reserved");
}

#[test]
fn bad_stream_ops() {
    let e = refused_streams(|b| op(b, 2).op.set(7));
    expect(e, Section::StreamOps, 2, "op");
    let e = refused_streams(|b| op(b, 1).stream.set(0));
    expect(e, Section::StreamOps, 1, "stream");
    let e = refused_streams(|b| op(b, 0).event.set(MAX_EVENTS as u32));
    expect(e, Section::StreamOps, 0, "event");
    let e = refused_streams(|b| op(b, 3).before_task.set(9));
    expect(e, Section::StreamOps, 3, "before_task");
    assert!(
        matches!(e.problem, Problem::OutOfRange { max: 8, .. }),
        "{e}"
    );
    // Op 1 moved before op 0's task: out of order.
    let e = refused_streams(|b| op(b, 1).before_task.set(1));
    expect(e, Section::StreamOps, 1, "before_task");
    assert_eq!(e.problem, Problem::Unsorted { previous: 0 });
    // Op 1 waits on event 5, which nothing records.
    let e = refused_streams(|b| op(b, 1).event.set(5));
    expect(e, Section::StreamOps, 1, "event");
    assert_eq!(e.problem, Problem::EventNotRecorded { event: 5 });
    assert!(
        e.to_string().contains("no earlier stream op records"),
        "{e}"
    );
    // Op 1 made a wait for event 3, which op 2 records only after it.
    let e = refused_streams(|b| op(b, 1).event.set(3));
    assert_eq!(e.problem, Problem::EventNotRecorded { event: 3 });
    let e = refused_streams(|b| {
        let args = header(b).args.offset.get();
        header(b).stream_ops.offset.set(args);
    });
    expect(e, Section::Header, 0, "stream_ops");
    assert_eq!(
        e.problem,
        Problem::SectionOverlap {
            other: Section::Args
        }
    );
}

#[test]
fn the_builder_refuses_bad_streams_and_events() {
    let mut b = TableBuilder::new();
    let x = b.tensor("X", &[1, 16]).unwrap();
    let args = [
        Arg::tile(x, wsp_ffi::ArgAccess::In, 0, 0, 1, 16),
        Arg::tile(x, wsp_ffi::ArgAccess::In, 0, 0, 1, 16),
        Arg::tile(x, wsp_ffi::ArgAccess::Out, 0, 0, 1, 16),
    ];
    let add = wsp_ffi::WspKernelId_WSP_KERNEL_ADD;
    let over = MAX_STREAMS as u32 + 1;
    assert_eq!(
        b.task_on(over, add, &args, &[]),
        Err(BuildError::NoSuchStream(over))
    );
    assert_eq!(b.record_event(0, 0), Err(BuildError::NoSuchStream(0)));
    let events = MAX_EVENTS as u32;
    assert_eq!(
        b.record_event(1, events),
        Err(BuildError::NoSuchEvent(events))
    );
    assert_eq!(b.wait_event(1, 2), Err(BuildError::EventNotRecorded(2)));
    assert_eq!(b.num_tasks(), 0);
}

/// Found by the `expand` fuzz target: a tensor whose span in bytes does not
/// fit in 64 bits. Shape [2^31 + 1, 16] with strides [2^31, 1] keeps its
/// rows apart as the validator requires, but its last element lies 2^62 +
/// 15 elements (2^64 + 60 bytes of f32) past its first. The multiplication
/// overflowed: a panic in debug builds, and in release a wrapped size of 64
/// bytes that fit any arena, so regions far outside it passed validation.
#[test]
fn a_tensor_spanning_more_than_u64_bytes() {
    let e = refused(|b| {
        let t = entry::<TensorDesc>(b, |h| h.tensors.offset.get(), 0);
        t.shape[0].set((1 << 31) + 1);
        t.shape[1].set(16);
        t.strides[0].set(1 << 31);
    });
    // The shape's fault, not the offset's (it was named on `arena_offset`).
    expect(e, Section::Tensors, 0, "shape");
    assert_eq!(e.problem, Problem::SizeOverflow);
    assert!(
        e.to_string()
            .contains("size in bytes (from its shape and strides) does not fit in 64 bits"),
        "{e}"
    );
}

/// More tensors than a launch record can name (`MAX_TENSORS`) are refused
/// before any of them is read: the tensors section is moved to the end of
/// a valid table and given one descriptor too many.
#[test]
fn too_many_tensors() {
    let e = refused(|b| {
        let at = b.len();
        b.resize(at + (MAX_TENSORS + 1) * size_of::<TensorDesc>(), 0);
        let len = b.len() as u32;
        let h = header(b);
        h.tensors.offset.set(at as u32);
        h.tensors.count.set(MAX_TENSORS as u32 + 1);
        h.total_len.set(len);
    });
    expect(e, Section::Header, 0, "tensors");
    assert_eq!(
        e.problem,
        Problem::OutOfRange {
            value: MAX_TENSORS as u64 + 1,
            min: 0,
            max: MAX_TENSORS as u64
        }
    );
}

/// A table file with bytes after the table (`cat table.bin garbage`): the
/// loaders' `Table::parse` reads `total_len` bytes of a longer window and
/// accepts it, `exact_table_len` (what a reader of a table file checks)
/// refuses it, naming the table's length and the bytes given.
#[test]
fn bytes_after_the_table_are_refused_where_the_bytes_are_one_table() {
    let mut bytes = valid();
    let total = bytes.len();
    assert_eq!(exact_table_len(&bytes), Ok(total));
    bytes.extend_from_slice(b"garbage\n");
    assert!(
        Table::parse(&bytes).is_ok(),
        "a loader's window may be longer"
    );
    let e = exact_table_len(&bytes).unwrap_err();
    expect(e, Section::Header, 0, "total_len");
    assert_eq!(
        e.problem,
        Problem::TrailingBytes {
            total_len: total as u64,
            given: total as u64 + 8
        }
    );
    assert!(
        e.to_string().contains(&format!(
            "the table is {total} bytes long, but {} bytes were given: 8 bytes follow it",
            total + 8
        )),
        "{e}"
    );
    // Cut short, as `Table::parse` says.
    let e = exact_table_len(&bytes[..total - 1]).unwrap_err();
    expect(e, Section::Header, 0, "total_len");
    assert_eq!(
        e.problem,
        Problem::Truncated {
            needed: total as u64,
            available: total as u64 - 1
        }
    );
    assert_eq!(Table::parse(&bytes[..total - 1]).unwrap_err(), e);
}
