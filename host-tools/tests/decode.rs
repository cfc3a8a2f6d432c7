//! Decode attention: the paged cache's metadata checks, the planner's
//! chunk rule on hand-made length sets, the outputs against the f64
//! reference on the shim and in semantic time (bit-identical), and the
//! planner's makespan against the lower bound on a skewed batch.
//!
//! Print the skew table: `cargo test -p host-tools --release --test decode
//! -- --nocapture skew`.

use std::num::NonZeroU32;

use device_runtime::sched::RunOptions;
use host_tools::attention::device::max_chunks;
use host_tools::attention::figures::measure;
use host_tools::attention::plan::{min_chunk, Item};
use host_tools::attention::workload::{decode_workload, named_with};
use host_tools::attention::{
    check_meta, choose_chunk, CostModel, DecodeData, DecodeShape, MetaError, Plan, Strategy,
};
use host_tools::semantic::{run_semantic, SemanticRun};
use host_tools::shim::Shim;
use host_tools::workloads::{Params, Workload};
use wsp_ffi::CoreKind;

fn shape(lengths: &[u32], d: u32, page: u32) -> DecodeShape {
    DecodeShape {
        lengths: lengths.to_vec(),
        q_heads: 8,
        kv_heads: 2,
        d,
        page,
    }
}

// ---- the cache and its metadata ------------------------------------------

#[test]
fn pages_are_shuffled_and_each_used_once() {
    let data = DecodeData::build(shape(&[40, 17, 1, 64], 8, 16), 3).unwrap();
    // ceil(40/16) + ceil(17/16) + 1 + 4 = 3 + 2 + 1 + 4 pages.
    assert_eq!(data.pages, 10);
    assert_eq!(data.width, 4);
    let mut used: Vec<i32> = (0..4)
        .flat_map(|b| data.table(b).unwrap()[..data.shape.pages_of(b).unwrap() as usize].to_vec())
        .collect();
    assert_ne!(used, (0..10).collect::<Vec<_>>(), "pages in order");
    used.sort();
    assert_eq!(used, (0..10).collect::<Vec<_>>());
    // Unused entries are -1, selected-position rows too.
    assert_eq!(data.table(1).unwrap()[2..], [-1, -1]);
    assert!(data.meta[4..8].iter().all(|&v| v == -1));
    data.check().unwrap();
}

#[test]
fn pages_of_and_table_refuse_requests_and_metadata_they_cannot_read() {
    // 3 requests of 40, 17 and 1 tokens in pages of 16: 3, 2 and 1 pages,
    // tables 3 wide, so meta is 2 x 3 rows of 3 = 18 entries.
    let data = DecodeData::build(shape(&[40, 17, 1], 8, 16), 3).unwrap();
    assert_eq!((data.width, data.meta.len()), (3, 18));
    let pages: Vec<u32> = (0..3).map(|b| data.shape.pages_of(b).unwrap()).collect();
    assert_eq!(pages, [3, 2, 1]);
    assert_eq!(data.table(1).unwrap(), &data.meta[6..9]);
    assert_eq!(data.table(1).unwrap()[2], -1);
    // Request 3 of 3 (once an index past `lengths` and past `meta`).
    let past = MetaError::NoSuchRequest {
        request: 3,
        batch: 3,
    };
    assert_eq!(data.shape.pages_of(3), Err(past.clone()));
    assert_eq!(data.table(3), Err(past.clone()));
    assert_eq!(
        past.to_string(),
        "no such request: request 3 of a batch of 3"
    );
    // Pages of 0 tokens (once a division by zero).
    let no_pages = shape(&[40, 17, 1], 8, 0);
    assert_eq!(
        no_pages.pages_of(0).unwrap_err().to_string(),
        "bad decode shape: page size 0"
    );
    // meta cut to 14 entries: request 2's table, entries 12..15, once
    // read past its end; request 0's, in range, is refused too (the
    // tables are not where a 2B x W layout puts them).
    let mut short = data.clone();
    short.meta.truncate(14);
    let cut = MetaError::MetaSize {
        got: 14,
        expected: 18,
    };
    assert_eq!(short.table(2), Err(cut.clone()));
    assert_eq!(short.table(0), Err(cut.clone()));
    assert_eq!(
        cut.to_string(),
        "metadata of 14 elements, expected 18 (2 rows per request)"
    );
}

#[test]
fn kv_rows_out_of_range_are_refused_naming_the_index() {
    // 3 requests of 40, 17 and 1 tokens in pages of 16 (3 + 2 + 1 = 6
    // pages, tables 3 wide), 2 KV heads of D = 8: each head's pool is 6 x
    // 32 = 192 rows, kv 2 x 192 x 8 = 3072 values.
    let data = DecodeData::build(shape(&[40, 17, 1], 8, 16), 3).unwrap();
    assert_eq!((data.pages, data.width, data.kv.len()), (6, 3, 3072));
    // Value row of token 5 of request 0 for head 1: its first page's
    // value half, 16 rows past the page's keys.
    let row = 192 + data.table(0).unwrap()[0] as usize * 32 + 16 + 5;
    assert_eq!(
        data.kv_row(0, 1, 5, true).unwrap(),
        &data.kv[row * 8..(row + 1) * 8]
    );
    let e = |data: &DecodeData, b: usize, h: u32, t: u32| {
        data.kv_row(b, h, t, false).unwrap_err().to_string()
    };
    assert_eq!(
        e(&data, 3, 0, 0),
        "no such KV row: request 3 of a batch of 3"
    );
    assert_eq!(e(&data, 0, 2, 0), "no such KV row: KV head 2 of 2");
    // Token 48 would be entry 3 of a 3-wide table.
    assert_eq!(
        e(&data, 0, 0, 48),
        "no such KV row: token 48 of request 0, past its 40 KV tokens"
    );
    // An entry naming page 6 of 6 would read head 1's row past the pool.
    let mut bad = data.clone();
    bad.meta[0] = 6;
    assert_eq!(
        e(&bad, 0, 1, 0),
        "request 0: page table entry 0 is page 6, outside the pool's 6 pages"
    );
    let mut short = data.clone();
    short.kv.truncate(100);
    let key_row = 192 + data.table(0).unwrap()[0] * 32;
    assert_eq!(
        e(&short, 0, 1, 0),
        format!("bad decode shape: kv holds 100 values, too few for row {key_row} of 8")
    );
    // A shape of 0 KV heads has no groups (its check refuses it; the
    // group once divided by zero).
    let none = DecodeShape {
        kv_heads: 0,
        ..data.shape.clone()
    };
    assert_eq!(none.group(), 0);
}

#[test]
fn bad_metadata_is_refused_naming_the_request() {
    let data = DecodeData::build(shape(&[40, 17, 1], 8, 16), 3).unwrap();
    let (w, pages) = (data.width as usize, data.pages);
    let lengths = data.shape.lengths.clone();
    // A length above the page table: request 1 has 2 pages (32 tokens).
    let mut long = lengths.clone();
    long[1] = 33;
    assert_eq!(
        check_meta(&long, &data.meta, data.width, pages, 16),
        Err(MetaError::TableTooShort {
            request: 1,
            len: 33,
            covered: 32
        })
    );
    // Beyond the table's width.
    long[1] = 49;
    long[0] = 49;
    assert!(matches!(
        check_meta(&long, &data.meta, data.width, pages, 16),
        Err(MetaError::TableTooShort {
            request: 0,
            covered: 48,
            ..
        })
    ));
    // A page outside the pool.
    let mut meta = data.meta.clone();
    meta[2 * 2 * w] = pages as i32;
    let e = check_meta(&lengths, &meta, data.width, pages, 16).unwrap_err();
    assert_eq!(
        e,
        MetaError::PageOutOfPool {
            request: 2,
            entry: 0,
            page: pages as i32,
            pages
        }
    );
    assert!(e.to_string().starts_with("request 2: "), "{e}");
    meta[2 * 2 * w] = -5;
    assert!(matches!(
        check_meta(&lengths, &meta, data.width, pages, 16),
        Err(MetaError::PageOutOfPool {
            request: 2,
            page: -5,
            ..
        })
    ));
    // A page size of 0 is named as such, not as a metadata size that
    // matches what it expects.
    let e = check_meta(&lengths, &data.meta, data.width, pages, 0).unwrap_err();
    assert_eq!(e, MetaError::Shape("page size 0".into()));
    assert_eq!(e.to_string(), "bad decode shape: page size 0");
    // A length of 0 is not supported.
    assert_eq!(
        DecodeData::build(shape(&[4, 0], 8, 16), 1).unwrap_err(),
        MetaError::EmptyRequest { request: 1 }
    );
    // Through the workload builder: the message names the request.
    let mut bad = data.clone();
    bad.meta[2 * 2 * w] = pages as i32 + 3;
    let plan = Plan::new(&bad.shape, Strategy::Unsplit).unwrap();
    let e = decode_workload("decode", &bad, &plan).err().unwrap();
    assert!(
        e.to_string().contains("request 2: page table entry 0"),
        "{e}"
    );
}

// ---- the planner ---------------------------------------------------------

/// Cost = tokens only.
const TOKENS: CostModel = CostModel { item: 0, token: 1 };

#[test]
fn all_lengths_one_are_not_split() {
    // 32 requests of 1 token, 8 KV heads, 8 cores: at the smallest chunk
    // (128) total = 256 items of cost(1), largest = cost(1), and
    // 8 waves * 8 cores = 64 <= 256: the rule holds at 128, the largest
    // allowed (1 rounded up to a page, raised to 128).
    let cost = CostModel::of(4, 128).unwrap();
    assert_eq!(choose_chunk(&[1; 32], 8, 8, 16, cost), Ok(128));
    let plan = Plan::new(
        &DecodeShape {
            lengths: vec![1; 32],
            q_heads: 32,
            kv_heads: 8,
            d: 128,
            page: 16,
        },
        Strategy::Planned { cores: 8 },
    )
    .unwrap();
    assert_eq!(
        (plan.items.len(), plan.merges(), plan.parts_rows),
        (256, 0, 0)
    );
}

#[test]
fn one_long_request_is_split_to_fill_the_cores() {
    // One request of 4096 tokens, one KV head; cost = tokens: total 4096
    // whatever the chunk, largest = c. 8 waves * c * cores <= 4096:
    // 2 cores: c <= 256; 4 cores: c <= 128; 8 cores: c <= 64, below the
    // smallest chunk, so 128.
    assert_eq!(choose_chunk(&[4096], 1, 2, 16, TOKENS), Ok(256));
    assert_eq!(choose_chunk(&[4096], 1, 4, 16, TOKENS), Ok(128));
    assert_eq!(choose_chunk(&[4096], 1, 8, 16, TOKENS), Ok(128));
    // Pages of 64: chunks are multiples of 64 (c <= 256 still).
    assert_eq!(choose_chunk(&[4096], 1, 2, 64, TOKENS), Ok(256));
    // One core: c <= 512.
    assert_eq!(choose_chunk(&[4096], 1, 1, 16, TOKENS), Ok(512));
    // 128 rounded up to pages of 16 and 64 is 128; a page of 256 is longer.
    let chunk = |page| min_chunk(NonZeroU32::new(page).unwrap()).get();
    assert_eq!(chunk(16), 128);
    assert_eq!(chunk(64), 128);
    assert_eq!(chunk(256), 256);
    // Pages of 1 (any multiple) and of 100 (128 rounds up to 200), and
    // the largest page, which is its own chunk.
    assert_eq!(chunk(1), 128);
    assert_eq!(chunk(100), 200);
    assert_eq!(chunk(u32::MAX), u32::MAX);
    // Data with pages of 0 tokens (the check refuses it) has at most 0
    // chunks (W pages of 0 tokens hold none), not a division by zero.
    let mut data = DecodeData::build(shape(&[40, 17], 8, 16), 3).unwrap();
    // Pages of 16: request 0's 40 tokens take 3 pages, the widest table;
    // 48 tokens in chunks of at least 128 are 1 chunk.
    assert_eq!(max_chunks(&data), 1);
    data.shape.page = 0;
    assert_eq!(max_chunks(&data), 0);
    // A table of u32::MAX pages (no check would pass it): W P overflows
    // u32, but the count is exact. Pages of 16, chunks of 128: ceil((2^32
    // - 1) / 8) = 2^29, as 2^32 - 1 = 8 (2^29 - 1) + 7. Pages of 100,
    // chunks of 200: ceil((2^32 - 1) / 2) = 2^31. The largest page is its
    // own chunk: one per page, W.
    data.width = u32::MAX;
    data.shape.page = 16;
    assert_eq!(max_chunks(&data), 1 << 29);
    data.shape.page = 100;
    assert_eq!(max_chunks(&data), 1 << 31);
    data.shape.page = u32::MAX;
    assert_eq!(max_chunks(&data), u32::MAX);
}

#[test]
fn the_fixed_cost_per_item_is_weighed_in_whole_waves() {
    // Four requests of 1000 tokens, 2 KV heads, 4 cores, pages of 10, an
    // item costs 100 + tokens. With k = ceil(1000 / c) chunks:
    // total = 2 * (4k * 100 + 4000) = 8000 + 800k, largest = 100 + c, and
    // the rule is 8 * 4 * (100 + c) <= 8000 + 800k.
    // c = 250 (k 4): 11200 <= 11200 holds; c = 260 (k 4): 11520 > 11200;
    // above, the left side only grows and the right is at most 11200.
    let cost = CostModel {
        item: 100,
        token: 1,
    };
    assert_eq!(choose_chunk(&[1000; 4], 2, 4, 10, cost), Ok(250));
    // At c = 250 the items are 4 * 2 * 4 = 32 equal ones: exactly 8 waves
    // of 4 cores, whatever an item's fixed cost (here 0 and 3000: the rule
    // holds with equality at 250 and fails at 260 for both).
    assert_eq!(choose_chunk(&[1000; 4], 2, 4, 10, TOKENS), Ok(250));
    let heavy = CostModel {
        item: 3000,
        token: 1,
    };
    assert_eq!(choose_chunk(&[1000; 4], 2, 4, 10, heavy), Ok(250));
    // Many equal requests: B * kv_heads = 64 >= 8 waves * 8 cores, so no
    // split even for long ones.
    assert_eq!(choose_chunk(&[5000; 32], 2, 8, 16, TOKENS), Ok(5008));
    // One fewer request: 62 items < 64: split.
    assert!(choose_chunk(&[5000; 31], 2, 8, 16, TOKENS).unwrap() < 5000);
}

#[test]
fn the_planner_refuses_what_it_cannot_plan() {
    // A page of 0 tokens and 0 cores (once planned as 1 core).
    assert_eq!(
        choose_chunk(&[100], 1, 1, 0, TOKENS),
        Err("page size 0".into())
    );
    let e = choose_chunk(&[100], 1, 0, 16, TOKENS).unwrap_err();
    assert!(e.contains("0 cores"), "{e}");
    // u32::MAX in pages of 16 is 2^32 tokens: past u32.
    let e = choose_chunk(&[u32::MAX], 1, 1, 16, TOKENS).unwrap_err();
    assert!(e.contains("passes u32::MAX"), "{e}");
    // The longest that fits, 2^32 - 16 = 4294967280 (a whole page count):
    // cost = tokens, one core, one head: 8 c <= 4294967280, c <= 536870910,
    // whose largest multiple of 16 is 33554431 * 16 = 536870896.
    assert_eq!(
        choose_chunk(&[u32::MAX - 15], 1, 1, 16, TOKENS),
        Ok(536870896)
    );
    // Costs whose total passes 128 bits: 32 requests of ~2^32 tokens
    // (2^37) x 2^64 cycles x 2^32 heads is ~2^133.
    let huge = CostModel {
        item: u64::MAX,
        token: u64::MAX,
    };
    let e = choose_chunk(&[u32::MAX - 15; 32], u32::MAX, 1, 16, huge).unwrap_err();
    assert!(e.contains("overflows"), "{e}");
    // The kernel's cost formula: G = 4, D = 128: item 4*4*128 + 4*4 = 2064;
    // token 2*128 + 2*4*128 + 6*4 + ceil((4*128 + 6*4) / 32) = 1304 + 17.
    assert_eq!(
        CostModel::of(4, 128),
        Ok(CostModel {
            item: 2064,
            token: 1321
        })
    );
    // An item's cost: 2064 + 1321 x 100 = 134164. Hand-set fields whose
    // cost passes 64 bits saturate (they once overflowed): 2^63 + 2 x
    // 2^62 = 2^64, and u64::MAX x 2 tokens.
    assert_eq!(CostModel::of(4, 128).unwrap().cost(100), 134164);
    let big = CostModel {
        item: 1 << 63,
        token: 1 << 62,
    };
    assert_eq!(big.cost(1), (1 << 63) + (1 << 62));
    assert_eq!(big.cost(2), u64::MAX);
    assert_eq!(huge.cost(2), u64::MAX);
    assert_eq!(huge.cost(0), u64::MAX);
    // G = D = u32::MAX: 4 G D is about 2^66 cycles.
    assert!(CostModel::of(u32::MAX, u32::MAX)
        .unwrap_err()
        .contains("overflows"));
    // Plan::new checks the shape and the strategy.
    let mut s = shape(&[40, 17], 8, 16);
    assert!(Plan::new(&s, Strategy::Planned { cores: 1 }).is_ok());
    let e = Plan::new(&s, Strategy::Planned { cores: 0 }).unwrap_err();
    assert!(e.contains("0 cores"), "{e}");
    s.kv_heads = 0;
    let e = Plan::new(&s, Strategy::Unsplit).unwrap_err();
    assert!(e.contains("not a whole number of groups"), "{e}");
    // with_chunk does not check: no KV heads, no groups, no items; and
    // Plan::check refuses the shape rather than dividing by 0.
    let empty = Plan::with_chunk(&s, 16);
    assert_eq!((empty.groups.len(), empty.items.len()), (0, 0));
    assert!(empty
        .check(&s)
        .unwrap_err()
        .contains("not a whole number of groups"));
    s.kv_heads = 2;
    s.page = 0;
    let e = Plan::new(&s, Strategy::Planned { cores: 1 }).unwrap_err();
    assert_eq!(e, "bad decode shape: page size 0");
}

#[test]
fn sizes_past_32_bits_are_counted_exactly_or_refused() {
    // with_chunk does not check the shape: a group of 2^31 query heads
    // per KV head, 2 tokens in chunks of 1, has 2 x 2^31 = 2^32 rows of
    // partial states, one past u32 (its sum once overflowed).
    let wide = DecodeShape {
        lengths: vec![2],
        q_heads: 1 << 31,
        kv_heads: 1,
        d: 1,
        page: 1,
    };
    let plan = Plan::with_chunk(&wide, 1);
    assert_eq!(plan.parts_rows, 1 << 32);
    assert_eq!(plan.groups[0].parts_row, Some(0));
    // One request, u32::MAX query and KV heads, one token in a page of
    // u32::MAX tokens: B x q_heads = 2^32 - 1 fits, but the pool is
    // (2^32 - 1) heads x 1 page x 2 x (2^32 - 1) rows =
    // 36893488130239234050, which once overflowed u64 in the build.
    let huge = DecodeShape {
        lengths: vec![1],
        q_heads: u32::MAX,
        kv_heads: u32::MAX,
        d: 1,
        page: u32::MAX,
    };
    let e = DecodeData::build(huge.clone(), 1).unwrap_err().to_string();
    assert!(
        e.contains("a pool of 36893488130239234050 rows does not fit 32-bit indices"),
        "{e}"
    );
    // The check of data claiming u32::MAX such pages: (2^32 - 1)^3 x 2 =
    // 158456324917848210770600394750 rows, past u64 too.
    let data = DecodeData {
        shape: huge,
        pages: u32::MAX,
        width: 1,
        q: vec![],
        kv: vec![],
        meta: vec![0, -1],
    };
    let e = data.check().unwrap_err().to_string();
    assert!(
        e.contains("a pool of 158456324917848210770600394750 rows does not fit"),
        "{e}"
    );
    // Its rows per KV head, 2 (2^32 - 1)^2, pass 64 bits: reported as
    // u32::MAX (which no check passes), not wrapped.
    assert_eq!(data.pool_rows(), u32::MAX);
    // 65536 requests x 65536 query heads = 2^32 query rows: refused by
    // the shape, as is 2 x 2^31 = 2^32 page-table rows.
    let mut many = shape(&[1; 65536], 8, 16);
    many.q_heads = 65536;
    many.kv_heads = 65536;
    let e = many.check().unwrap_err().to_string();
    assert!(
        e.contains("65536 requests: 4294967296 query rows (requests x query heads) exceed"),
        "{e}"
    );
}

#[test]
fn a_plan_lists_chunks_on_multiples_of_the_chunk_longest_first() {
    let s = shape(&[1001, 3], 8, 16);
    let plan = Plan::with_chunk(&s, 250);
    // Request 0: chunks of 250 at 0, 250, 500, 750 and 1 token at 1000,
    // per KV head; request 1: one chunk of 3 per head.
    assert_eq!(plan.items.len(), 2 * 5 + 2);
    assert_eq!(plan.merges(), 2);
    // G = 4 rows per chunk state: 5 * 4 per split group.
    assert_eq!(plan.parts_rows, 40);
    assert_eq!(plan.groups[1].parts_row, Some(20));
    assert_eq!(plan.groups[2].parts_row, None);
    let counts: Vec<u32> = plan.items.iter().map(|i| i.count).collect();
    assert_eq!(counts, [250, 250, 250, 250, 250, 250, 250, 250, 3, 3, 1, 1]);
    assert_eq!(
        plan.items[1],
        Item {
            request: 0,
            kv_head: 0,
            chunk: 1,
            first: 250,
            count: 250
        }
    );
    assert_eq!(plan.items[10].first, 1000);
    let unsplit = Plan::new(&s, Strategy::Unsplit).unwrap();
    assert_eq!((unsplit.items.len(), unsplit.merges()), (4, 0));
}

#[test]
fn a_plan_not_made_for_the_data_is_refused() {
    let data = DecodeData::build(shape(&[40, 17, 1], 8, 16), 3).unwrap();
    let err = |plan: &Plan| match decode_workload("decode", &data, plan) {
        Ok(_) => panic!("a plan of {} items was taken", plan.items.len()),
        Err(e) => e.to_string(),
    };
    // Its own plan, items in any order, is taken.
    let mut plan = Plan::with_chunk(&data.shape, 16);
    plan.items.reverse();
    assert!(decode_workload("decode", &data, &plan).is_ok());
    // A plan for a shorter request 1 (17 tokens in the data, 15 in the
    // plan) would attend to 15 of its tokens; one for a longer request
    // would read past them.
    for other in [[40, 15, 1], [40, 33, 1]] {
        let plan = Plan::with_chunk(&shape(&other, 8, 16), 16);
        let e = err(&plan);
        assert!(e.contains("request 1, KV head 0: "), "{e}");
        assert!(e.contains("its 17 KV tokens in chunks of 16"), "{e}");
    }
    // The same chunk counts, other token ranges: request 0 of 40 tokens
    // in chunks of 16 is 3 chunks; so are 33 tokens, and the plan's last
    // item would end at token 33.
    let plan = Plan::with_chunk(&shape(&[33, 17, 1], 8, 16), 16);
    let e = err(&plan);
    assert!(
        e.contains("request 0, KV head 0: the plan's items are"),
        "{e}"
    );
    // Another batch or other heads: the groups do not match.
    let plan = Plan::with_chunk(&shape(&[40, 17], 8, 16), 16);
    assert!(err(&plan).contains(
        "the plan has 4 (request, KV head) groups; the shape has 6 (3 requests x 2 KV heads)"
    ));
    // An item left out: request 2's outputs would never be written.
    let mut plan = Plan::with_chunk(&data.shape, 16);
    plan.items.retain(|it| it.request != 2);
    assert!(err(&plan).contains("the plan has 10 items; its groups have 12 chunks"));
    // A chunk of 0 is refused, not taken as 1.
    let plan = Plan::new(&data.shape, Strategy::Fixed(0)).unwrap();
    assert_eq!(plan.chunk, 0);
    assert!(err(&plan).contains("chunks of 0 tokens"));
    let e = named_with("decode", small(8, 16), Strategy::Fixed(0))
        .err()
        .unwrap();
    assert!(e.to_string().contains("chunks of 0 tokens"), "{e}");
}

#[test]
fn an_unknown_name_and_a_plan_for_no_cores_are_refused() {
    // Unknown names used to get `decode-uniform`'s lengths silently.
    let e = named_with("decode-uniformm", small(8, 16), Strategy::Unsplit)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("no decode workload named `decode-uniformm`"),
        "{e}"
    );
    assert!(e.contains("decode, decode-uniform, decode-skew"), "{e}");
    // 0 cores used to be planned as 1, without a word.
    let e = named_with("decode", small(8, 16), Strategy::Planned { cores: 0 })
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("0 cores"), "{e}");
    for name in ["decode", "decode-uniform", "decode-skew"] {
        assert!(named_with(name, small(8, 16), Strategy::Planned { cores: 1 }).is_ok());
    }
}

// ---- runs ----------------------------------------------------------------

/// Small sizes for debug builds: 8 requests up to 300 tokens.
fn small(d: u32, page: u32) -> Params {
    Params {
        m: 8,
        n: 300,
        k: d,
        tile: page,
        seed: 5,
    }
}

fn cores(cube: usize, vector: usize) -> Vec<CoreKind> {
    let mut k = vec![CoreKind::Cube; cube];
    k.extend(vec![CoreKind::Vector; vector]);
    k
}

fn semantic(w: &Workload, kinds: &[CoreKind]) -> (SemanticRun, Vec<u8>) {
    let mut arena = w.arena.clone();
    let run = run_semantic(&w.table, &mut arena.bytes, kinds, &RunOptions::default()).unwrap();
    let v = w.verify(&arena);
    assert!(v.passed(), "{}: {v}", w.name);
    (run, arena.bytes)
}

#[test]
fn decode_matches_the_reference_on_the_shim_and_in_semantic_time_bit_identically() {
    for (name, d, page) in [
        ("decode", 64, 16),
        ("decode", 128, 64),
        ("decode-uniform", 64, 64),
        ("decode-skew", 128, 16),
    ] {
        for strategy in [
            Strategy::Unsplit,
            Strategy::Fixed(64),
            Strategy::Planned { cores: 4 },
        ] {
            let w = named_with(name, small(d, page), strategy).unwrap();
            let (_, semantic_bytes) = semantic(&w, &cores(4, 4));
            let mut arena = w.arena.clone();
            Shim::default().run(&w.table, &mut arena.bytes).unwrap();
            let v = w.verify(&arena);
            assert!(v.passed(), "{name} {strategy:?} on the shim: {v}");
            assert!(
                arena.bytes == semantic_bytes,
                "{name} {strategy:?}: the shim and semantic time differ"
            );
        }
    }
}

#[test]
fn the_planner_comes_within_10_percent_of_the_bound_on_a_skewed_batch() {
    // 32 requests: one of 2048 tokens, the others 1 ..= 64; D 64, pages
    // of 16; 24 cube cores (three times the KV heads, as an Ascend 910B)
    // and 8 vector cores.
    let p = Params {
        m: 32,
        n: 2048,
        k: 64,
        tile: 16,
        seed: 3,
    };
    let rows = makespan_table("decode-skew", p, 24, 8);
    let [unsplit, fixed, planned] = &rows[..] else {
        unreachable!()
    };
    // (a) waits for the long request's 8 unsplit items, on 8 of the 24
    // cores: far above the bound.
    assert!(unsplit.vs_least > 2.0, "{unsplit:?}");
    assert!(fixed.vs_least < unsplit.vs_least, "{fixed:?}");
    assert!(planned.vs_least <= 1.10, "{planned:?}");
    assert!(planned.vs_own <= planned.vs_least);
}

/// One strategy's makespan against the bounds.
#[derive(Debug)]
#[allow(dead_code)] // the label is read through Debug
struct Row {
    label: &'static str,
    /// Makespan / this plan's own bound (its work per core, its chain).
    vs_own: f64,
    /// Makespan / the least bound of any plan.
    vs_least: f64,
}

/// Runs the decode workload `name` of `p` unsplit, in fixed chunks of 512
/// and planned for `cube` cores; prints the table and returns its rows.
fn makespan_table(name: &'static str, p: Params, cube: usize, vector: usize) -> Vec<Row> {
    let kinds = cores(cube, vector);
    let strategies = [
        ("(a) unsplit", Strategy::Unsplit),
        ("(b) fixed 512", Strategy::Fixed(512)),
        ("(c) planner", Strategy::Planned { cores: cube as u32 }),
    ];
    let figs: Vec<_> = strategies
        .iter()
        .map(|&(label, s)| {
            let w = named_with(name, p, s).unwrap();
            let f = measure(&w, &kinds).unwrap();
            assert!(f.check.passed(), "{label}: {}", f.check);
            (label, w, f)
        })
        .collect();
    // No plan does less cube work than the unsplit one (each split adds
    // a fixed cost per item): the least bound of any plan.
    let least = figs[0].2.cube_work.div_ceil(cube as u64);
    println!(
        "{name} m {} n {} D {} P {}, {cube} cube + {vector} vector cores",
        p.m, p.n, p.k, p.tile
    );
    println!(
        "{:<14} {:>6} {:>14} {:>12} {:>12} {:>12} {:>10} {:>10}",
        "strategy", "tasks", "chunk", "makespan", "own bound", "least bound", "/own", "/least"
    );
    figs.iter()
        .map(|(label, w, f)| {
            let own = f.makespan as f64 / f.bound as f64;
            let low = f.makespan as f64 / least as f64;
            let chunk = w
                .summary
                .split("; ")
                .nth(1)
                .unwrap_or("")
                .split(':')
                .next()
                .unwrap_or("");
            println!(
                "{label:<14} {:>6} {:>14} {:>12} {:>12} {:>12} {own:>10.3} {low:>10.3}",
                w.tasks, chunk, f.makespan, f.bound, least
            );
            Row {
                label,
                vs_own: own,
                vs_least: low,
            }
        })
        .collect()
}

/// The release-size figures: `cargo test -p host-tools --release --test
/// decode -- --nocapture skew_figures` (a release build runs them; CI's
/// release-size step too).
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "release-size run: minutes in a debug build"
)]
fn skew_figures() {
    for name in ["decode-skew", "decode", "decode-uniform"] {
        let p = Params::of(name).unwrap();
        for (cube, vector) in [(8, 8), (24, 24)] {
            makespan_table(name, p, cube, vector);
        }
    }
}

#[test]
fn the_decode_lengths_include_the_edge_cases() {
    let l = host_tools::attention::workload::lengths_of("decode", 32, 8192);
    assert_eq!(l.len(), 32);
    for edge in [1, 2, 3, 63, 64, 65, 8191, 8192] {
        assert!(l.contains(&edge), "{edge} missing from {l:?}");
    }
    // Fewer requests than edge cases: the longest is still n (`--n` is
    // never ignored), the others the first edge cases.
    for m in 1..=8u32 {
        let l = host_tools::attention::workload::lengths_of("decode", m, 5000);
        let mut want: Vec<u32> = [1, 2, 3, 63, 64, 65, 4999][..m as usize - 1].to_vec();
        want.push(5000);
        assert_eq!(l, want, "m = {m}");
    }
    let skew = host_tools::attention::workload::lengths_of("decode-skew", 32, 8192);
    assert_eq!(skew.iter().filter(|&&x| x == 8192).count(), 1);
    assert!(skew.iter().filter(|&&x| x != 8192).all(|&x| x <= 256));
}

#[test]
fn non_finite_data_and_bad_selections_are_refused_naming_where() {
    use host_tools::attention::reference::{attention, attention_over};
    let data = DecodeData::build(shape(&[40, 17, 1], 8, 16), 3).unwrap();
    let plan = Plan::with_chunk(&data.shape, 16);
    // D = 8: element 5 * 8 + 3 of kv is row 5, column 3.
    // Buffers that do not match the shape: 3 requests x 8 query heads = 24
    // rows of q, of 8 values each.
    let mut short = data.clone();
    short.q.pop();
    let e = short.check().unwrap_err().to_string();
    assert!(
        e.contains("q holds 191 values; its shape takes 24 rows of 8, 192"),
        "{e}"
    );
    let mut long = data.clone();
    long.kv.push(0.0);
    let e = long.check().unwrap_err().to_string();
    assert!(e.contains("kv holds 3073 values"), "{e}");
    let mut bad = data.clone();
    bad.kv[5 * 8 + 3] = f32::NAN;
    let e = MetaError::NonFinite {
        tensor: "kv",
        row: 5,
        col: 3,
        bits: f32::NAN.to_bits(),
    };
    assert_eq!(bad.check(), Err(e.clone()));
    assert_eq!(
        e.to_string(),
        "kv row 5 column 3 is NaN (queries, keys and values must be finite)"
    );
    let why = decode_workload("decode", &bad, &plan).err().unwrap();
    assert!(
        why.to_string().contains("kv row 5 column 3 is NaN"),
        "{why}"
    );
    assert!(attention(&bad).unwrap_err().contains("kv row 5 column 3"));
    // An infinite query, element 2 * 8 + 1: q row 2, column 1.
    let mut bad = data.clone();
    bad.q[17] = f32::NEG_INFINITY;
    assert!(decode_workload("decode", &bad, &plan)
        .err()
        .unwrap()
        .to_string()
        .contains("q row 2 column 1 is -inf"));
    // Request 1 has 17 tokens on 2 pages of 16: token 17 is on a page it
    // owns but past its length (once read silently), 32 past its pages.
    for t in [17, 32] {
        let e = attention_over(&data, |b| if b == 1 { vec![0, t] } else { vec![0] }).unwrap_err();
        assert_eq!(e, format!("request 1: token {t} is past its 17 KV tokens"));
    }
    // No token at all: once an output of zeros with a bound of zero.
    let e = attention_over(&data, |b| if b == 2 { vec![] } else { vec![0] }).unwrap_err();
    assert!(e.starts_with("request 2: no tokens"), "{e}");
    assert!(attention_over(&data, |_| vec![0]).is_ok());
}

#[test]
fn the_bound_refuses_a_reference_of_other_sizes() {
    use host_tools::attention::reference::{attention, bound, Reference};
    // 3 requests x 8 query heads = 24 rows of D = 8: 192 outputs.
    let data = DecodeData::build(shape(&[40, 17, 1], 8, 16), 3).unwrap();
    let r = attention(&data).unwrap();
    assert_eq!(bound(&r, |_| 1).unwrap().len(), 192);
    // Head dimension 0 (once a division by zero).
    let zero = Reference { d: 0, ..r.clone() };
    assert_eq!(
        bound(&zero, |_| 1).unwrap_err(),
        "the reference has head dimension 0"
    );
    // Per-row vectors one short, and outputs of other than 24 rows of 8
    // (each once an index past a vector's end).
    let mut short = r.clone();
    short.len.pop();
    assert_eq!(
        bound(&short, |_| 1).unwrap_err(),
        "the reference has 23 row lengths but 24 dot_abs and 24 score2_abs"
    );
    let mut short = r.clone();
    short.score2_abs.pop();
    assert_eq!(
        bound(&short, |_| 1).unwrap_err(),
        "the reference has 24 row lengths but 24 dot_abs and 23 score2_abs"
    );
    let mut short = r.clone();
    short.weighted_abs.pop();
    assert_eq!(
        bound(&short, |_| 1).unwrap_err(),
        "the reference has 192 o and 191 weighted_abs values; 24 rows of 8 take 192"
    );
    let mut long = r.clone();
    long.o.push(0.0);
    assert_eq!(
        bound(&long, |_| 1).unwrap_err(),
        "the reference has 193 o and 192 weighted_abs values; 24 rows of 8 take 192"
    );
}

#[test]
fn the_reference_of_one_token_is_its_value_row_through_the_page_table() {
    // softmax over one token is 1: the output is the value row, which the
    // reference must find on the page the table names (not page 0).
    let data = DecodeData::build(shape(&[1, 1, 1], 4, 2), 9).unwrap();
    let r = host_tools::attention::reference::attention(&data).unwrap();
    for b in 0..3 {
        let page = data.table(b).unwrap()[0] as usize;
        for j in 0..8usize {
            let h = j / 4;
            // Pool of head h: rows h * pages * 2P ..; values P rows below the keys.
            let row = h * data.pool_rows() as usize + page * 4 + 2;
            let v: Vec<f64> = data.kv[row * 4..row * 4 + 4]
                .iter()
                .map(|&x| x as f64)
                .collect();
            let at = (b * 8 + j) * 4;
            assert_eq!(r.o[at..at + 4], v[..], "request {b} head {j}");
        }
    }
}
