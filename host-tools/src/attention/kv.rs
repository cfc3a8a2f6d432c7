//! The paged KV cache and its metadata: random queries, keys and values,
//! pages handed to requests in shuffled order, and the checks that refuse
//! bad metadata by request.

use std::fmt;

use crate::rng::SplitMix64;

/// The kernels' largest GQA group (`attn_decode_partial`'s query rows).
pub const MAX_GROUP: u32 = 16;
/// The kernels' largest head dimension.
pub const MAX_DIM: u32 = 128;

/// The sizes of one decode step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeShape {
    /// KV length of each request (the batch is `lengths.len()`); each >= 1.
    pub lengths: Vec<u32>,
    /// Query heads per request.
    pub q_heads: u32,
    /// KV heads per request; divides `q_heads`.
    pub kv_heads: u32,
    /// Head dimension, 1 ..= [`MAX_DIM`].
    pub d: u32,
    /// Tokens per page (`P`).
    pub page: u32,
}

impl DecodeShape {
    /// Requests in the batch; `u32::MAX` for more, which
    /// [`DecodeShape::check`] refuses (rather than a count cut to 32 bits).
    pub fn batch(&self) -> u32 {
        u32::try_from(self.lengths.len()).unwrap_or(u32::MAX)
    }

    /// Query heads per KV head (`G`); 0 for 0 KV heads (no groups), which
    /// [`DecodeShape::check`] refuses, rather than a division by zero.
    pub fn group(&self) -> u32 {
        self.q_heads.checked_div(self.kv_heads).unwrap_or(0)
    }

    /// Pages request `b` needs: `ceil(len / P)`. Refused: a request past
    /// the batch ([`MetaError::NoSuchRequest`]) and a page size of 0 (a
    /// [`MetaError::Shape`], as [`DecodeShape::check`] refuses it).
    pub fn pages_of(&self, b: usize) -> Result<u32, MetaError> {
        let Some(&len) = self.lengths.get(b) else {
            return Err(MetaError::NoSuchRequest {
                request: b,
                batch: self.lengths.len(),
            });
        };
        if self.page == 0 {
            return Err(MetaError::Shape("page size 0".into()));
        }
        Ok(len.div_ceil(self.page))
    }

    /// Checks the head counts, head dimension, page size and lengths, and
    /// that the batch's `B x q_heads` query rows and `2B` page-table rows
    /// fit the table's 32-bit sizes (so does every product of the batch
    /// and a head count that the tables and programs take).
    pub fn check(&self) -> Result<(), MetaError> {
        let bad = |why: String| Err(MetaError::Shape(why));
        if self.lengths.is_empty() {
            return bad("the batch is empty".into());
        }
        let b = self.lengths.len() as u128;
        for (rows, what) in [
            (
                b * self.q_heads as u128,
                "query rows (requests x query heads)",
            ),
            (2 * b, "page-table rows (2 per request)"),
        ] {
            if rows > u32::MAX as u128 {
                return bad(format!(
                    "{} requests: {rows} {what} exceed the table's 32-bit sizes",
                    self.lengths.len()
                ));
            }
        }
        if self.kv_heads == 0 || self.q_heads == 0 || !self.q_heads.is_multiple_of(self.kv_heads) {
            return bad(format!(
                "{} query heads are not a whole number of groups of {} KV heads",
                self.q_heads, self.kv_heads
            ));
        }
        if self.group() > MAX_GROUP {
            return bad(format!(
                "a group of {} query heads per KV head exceeds the kernels' {MAX_GROUP}",
                self.group()
            ));
        }
        if self.d == 0 || self.d > MAX_DIM {
            return bad(format!("head dimension {} is not in 1..={MAX_DIM}", self.d));
        }
        if self.page == 0 {
            return bad("page size 0".into());
        }
        if let Some(b) = self.lengths.iter().position(|&l| l == 0) {
            return Err(MetaError::EmptyRequest { request: b });
        }
        Ok(())
    }
}

/// Why decode metadata is refused; every variant about one request names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetaError {
    /// Head counts, head dimension or page size the kernels cannot take.
    Shape(String),
    /// A request with no KV tokens: not supported (its softmax is over
    /// nothing; a serving engine does not schedule it).
    EmptyRequest {
        /// The request's index in the batch.
        request: usize,
    },
    /// A length above what the request's page table covers.
    TableTooShort {
        /// The request's index in the batch.
        request: usize,
        /// Its KV length.
        len: u32,
        /// Tokens its page table covers: its leading valid entries times `P`.
        covered: u64,
    },
    /// A page table entry naming no page of the pool.
    PageOutOfPool {
        /// The request's index in the batch.
        request: usize,
        /// The entry's index in the request's page table.
        entry: usize,
        /// The page it names.
        page: i32,
        /// Pages in the pool.
        pages: u32,
    },
    /// A query, key or value that is NaN or infinite: the reference
    /// would be NaN and the check a FAIL that names no cause. Also a
    /// sparse indexer's query, head weight or key
    /// ([`SparseData::check`](super::sparse::SparseData::check)), whose
    /// NaN would make the top-k arbitrary.
    NonFinite {
        /// `q` or `kv`; for the indexer `iq`, `iw` or `keys`.
        tensor: &'static str,
        /// Its row.
        row: usize,
        /// Its column.
        col: usize,
        /// The value's bits (`f32::from_bits`; bits keep the error `Eq`).
        bits: u32,
    },
    /// The metadata tensor's size is not `2B x W`.
    MetaSize {
        /// Elements given.
        got: usize,
        /// Elements due (exact: `2B x W` may pass `usize`).
        expected: u128,
    },
    /// A row asked of [`DecodeData::kv_row`] that the data does not
    /// hold: a request, KV head or token out of range (named, with its
    /// bound).
    NoSuchRow(String),
    /// A request asked of [`DecodeShape::pages_of`] or
    /// [`DecodeData::table`] past the batch.
    NoSuchRequest {
        /// The index asked for.
        request: usize,
        /// Requests in the batch.
        batch: usize,
    },
}

impl fmt::Display for MetaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetaError::Shape(why) => write!(f, "bad decode shape: {why}"),
            MetaError::EmptyRequest { request } => write!(
                f,
                "request {request}: KV length 0 (every request needs at least one token)"
            ),
            MetaError::TableTooShort {
                request,
                len,
                covered,
            } => write!(
                f,
                "request {request}: KV length {len} exceeds the {covered} tokens its page table covers"
            ),
            MetaError::PageOutOfPool {
                request,
                entry,
                page,
                pages,
            } => write!(
                f,
                "request {request}: page table entry {entry} is page {page}, outside the pool's {pages} pages"
            ),
            MetaError::NonFinite {
                tensor,
                row,
                col,
                bits,
            } => {
                let what = match *tensor {
                    "iq" | "iw" | "keys" => "the indexer's queries, weights and keys",
                    _ => "queries, keys and values",
                };
                write!(
                    f,
                    "{tensor} row {row} column {col} is {} ({what} must be finite)",
                    f32::from_bits(*bits)
                )
            }
            MetaError::MetaSize { got, expected } => write!(
                f,
                "metadata of {got} elements, expected {expected} (2 rows per request)"
            ),
            MetaError::NoSuchRow(why) => write!(f, "no such KV row: {why}"),
            MetaError::NoSuchRequest { request, batch } => {
                write!(f, "no such request: request {request} of a batch of {batch}")
            }
        }
    }
}

impl std::error::Error for MetaError {}

/// Checks every request's page table against its length and the pool:
/// the first `ceil(len / P)` entries of row `2b` of `meta` (`W` = `width`
/// columns) must name pages `0 .. pages`. Entries past those are not read.
/// A page size (`P` = `page`) of 0 is a [`MetaError::Shape`].
pub fn check_meta(
    lengths: &[u32],
    meta: &[i32],
    width: u32,
    pages: u32,
    page: u32,
) -> Result<(), MetaError> {
    if page == 0 {
        return Err(MetaError::Shape("page size 0".into()));
    }
    let w = width as usize;
    let expected = 2 * lengths.len() as u128 * width as u128;
    if meta.len() as u128 != expected {
        return Err(MetaError::MetaSize {
            got: meta.len(),
            expected,
        });
    }
    for (b, &len) in lengths.iter().enumerate() {
        if len == 0 {
            return Err(MetaError::EmptyRequest { request: b });
        }
        let table = &meta[2 * b * w..(2 * b + 1) * w];
        let needed = len.div_ceil(page) as usize;
        for (entry, &p) in table.iter().enumerate().take(needed) {
            if p == -1 {
                return Err(MetaError::TableTooShort {
                    request: b,
                    len,
                    covered: entry as u64 * page as u64,
                });
            }
            if p < 0 || p as u32 >= pages {
                return Err(MetaError::PageOutOfPool {
                    request: b,
                    entry,
                    page: p,
                    pages,
                });
            }
        }
        if needed > w {
            return Err(MetaError::TableTooShort {
                request: b,
                len,
                covered: w as u64 * page as u64,
            });
        }
    }
    Ok(())
}

/// One decode step's data: queries, the paged pool and the metadata, laid
/// out as the tensors `q`, `kv` and `meta` (see [the module
/// layout](super)).
#[derive(Clone, Debug)]
pub struct DecodeData {
    /// The sizes.
    pub shape: DecodeShape,
    /// Pages in each KV head's pool: exactly the pages the requests use.
    pub pages: u32,
    /// Page table width `W`: the most pages any request uses.
    pub width: u32,
    /// `[B * q_heads, D]`, uniform in [-1, 1).
    pub q: Vec<f32>,
    /// `[kv_heads * pages * 2P, D]`, uniform in [-1, 1) (rows past a
    /// request's last token too, so reading them shows).
    pub kv: Vec<f32>,
    /// `[2B, W]`: page tables (unused entries -1), selected positions (-1).
    pub meta: Vec<i32>,
}

impl DecodeData {
    /// Random queries and cache for `shape`, seeded by `seed`: request
    /// `b`'s pages are a slice of a shuffled permutation of the pool.
    pub fn build(shape: DecodeShape, seed: u64) -> Result<DecodeData, MetaError> {
        shape.check()?;
        let b = shape.lengths.len();
        let per = (0..b)
            .map(|i| shape.pages_of(i))
            .collect::<Result<Vec<u32>, _>>()?;
        let pages: u64 = per.iter().map(|&p| p as u64).sum();
        let width = *per.iter().max().expect("a batch is not empty");
        // u128: pages sums B u32 counts, so the product may pass u64.
        let rows = shape.kv_heads as u128 * pages as u128 * 2 * shape.page as u128;
        if rows > u32::MAX as u128 || pages > i32::MAX as u64 {
            return Err(MetaError::Shape(format!(
                "a pool of {rows} rows does not fit 32-bit indices"
            )));
        }
        let pages = pages as u32;
        let mut rng = SplitMix64::new(seed);
        let mut order: Vec<i32> = (0..pages as i32).collect();
        for i in (1..order.len()).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            order.swap(i, j);
        }
        let w = width as usize;
        // Each request has a page and the pool fits u32 rows of 2 per page:
        // B and W are below 2^31, and 2 B W below 2^63.
        let mut meta = vec![-1i32; 2 * b * w];
        let mut next = 0usize;
        for (i, &n) in per.iter().enumerate() {
            let n = n as usize;
            meta[2 * i * w..2 * i * w + n].copy_from_slice(&order[next..next + n]);
            next += n;
        }
        let d = shape.d as usize;
        // The shape's check bounds B x q_heads by u32, D by 128.
        let q = rng.fill(b * shape.q_heads as usize * d);
        let kv = rng.fill(rows as usize * d);
        Ok(DecodeData {
            shape,
            pages,
            width,
            q,
            kv,
            meta,
        })
    }

    /// Rows of one KV head's pool: `pages * 2P`; `u32::MAX` for more,
    /// which [`DecodeData::check`] refuses (rather than a count wrapped to
    /// 32 bits).
    pub fn pool_rows(&self) -> u32 {
        let rows = self.pages as u128 * 2 * self.shape.page as u128;
        u32::try_from(rows).unwrap_or(u32::MAX)
    }

    /// Request `b`'s page table (`W` entries). Refused: a request past
    /// the batch ([`MetaError::NoSuchRequest`]) and a `meta` of other
    /// than `2B x W` values ([`MetaError::MetaSize`], as [`check_meta`]
    /// refuses it). The entries themselves are not checked.
    pub fn table(&self, b: usize) -> Result<&[i32], MetaError> {
        let batch = self.shape.lengths.len();
        if b >= batch {
            return Err(MetaError::NoSuchRequest { request: b, batch });
        }
        let expected = 2 * batch as u128 * self.width as u128;
        if self.meta.len() as u128 != expected {
            return Err(MetaError::MetaSize {
                got: self.meta.len(),
                expected,
            });
        }
        // Checked: b < B and meta holds 2B x W values.
        Ok(self.table_unchecked(b))
    }

    /// [`DecodeData::table`] unchecked: the caller has checked `b` is in
    /// the batch and `meta` holds `2B x W` values (as [`check_meta`]
    /// does); otherwise it may panic.
    pub(crate) fn table_unchecked(&self, b: usize) -> &[i32] {
        let w = self.width as usize;
        &self.meta[2 * b * w..(2 * b + 1) * w]
    }

    /// Checks the shape ([`DecodeShape::check`]), the metadata (see
    /// [`check_meta`]), that the pool's `kv_heads x pages x 2P` rows fit
    /// 32 bits (as [`DecodeData::build`] makes them), the sizes of `q`
    /// and `kv`, and that every query, key and value is finite
    /// ([`MetaError::NonFinite`] names the first that is not).
    pub fn check(&self) -> Result<(), MetaError> {
        self.shape.check()?;
        check_meta(
            &self.shape.lengths,
            &self.meta,
            self.width,
            self.pages,
            self.shape.page,
        )?;
        let d = self.shape.d as usize;
        // `[B * q_heads, D]` and `[kv_heads * pool rows, D]`: a shorter
        // buffer would be read past its end, a longer one hides a mistake.
        let s = &self.shape;
        let q_rows = s.lengths.len() as u128 * s.q_heads as u128;
        let kv_rows = s.kv_heads as u128 * self.pages as u128 * 2 * s.page as u128;
        if kv_rows > u32::MAX as u128 {
            return Err(MetaError::Shape(format!(
                "a pool of {kv_rows} rows does not fit 32-bit indices"
            )));
        }
        for (tensor, values, rows) in [("q", &self.q, q_rows), ("kv", &self.kv, kv_rows)] {
            let want = rows * d as u128;
            if values.len() as u128 != want {
                return Err(MetaError::Shape(format!(
                    "{tensor} holds {} values; its shape takes {rows} rows of {d}, {want}",
                    values.len()
                )));
            }
        }
        for (tensor, values) in [("q", &self.q), ("kv", &self.kv)] {
            if let Some(i) = values.iter().position(|v| !v.is_finite()) {
                return Err(MetaError::NonFinite {
                    tensor,
                    row: i / d,
                    col: i % d,
                    bits: values[i].to_bits(),
                });
            }
        }
        Ok(())
    }

    /// The key (`value = false`) or value row of token `t` of request `b`
    /// for KV head `h`, read through the page table. Refused: a request
    /// past the batch, a KV head past `kv_heads` and a token past the
    /// request's length ([`MetaError::NoSuchRow`], naming the index and
    /// its bound), a shape [`DecodeShape::check`] refuses, page tables
    /// [`check_meta`] refuses, and a `kv` too short for the row.
    pub fn kv_row(&self, b: usize, h: u32, t: u32, value: bool) -> Result<&[f32], MetaError> {
        let s = &self.shape;
        let missing = |why: String| Err(MetaError::NoSuchRow(why));
        let Some(&len) = s.lengths.get(b) else {
            return missing(format!("request {b} of a batch of {}", s.lengths.len()));
        };
        if h >= s.kv_heads {
            return missing(format!("KV head {h} of {}", s.kv_heads));
        }
        if t >= len {
            return missing(format!(
                "token {t} of request {b}, past its {len} KV tokens"
            ));
        }
        s.check()?;
        check_meta(&s.lengths, &self.meta, self.width, self.pages, s.page)?;
        // The tables are checked, so the page is one of the pool's: the
        // row is below kv_heads x pages x 2P, exact in u128.
        let p = s.page as u128;
        let page = self.table_unchecked(b)[(t / s.page) as usize] as u128;
        let row = h as u128 * self.pages as u128 * 2 * p
            + page * 2 * p
            + if value { p } else { 0 }
            + (t % s.page) as u128;
        let d = s.d as u128;
        usize::try_from(row * d)
            .ok()
            .zip(usize::try_from((row + 1) * d).ok())
            .and_then(|(start, end)| self.kv.get(start..end))
            .ok_or_else(|| {
                MetaError::Shape(format!(
                    "kv holds {} values, too few for row {row} of {d}",
                    self.kv.len()
                ))
            })
    }

    /// [`DecodeData::kv_row`] unchecked, for the reference's inner loops:
    /// the caller has checked the data ([`DecodeData::check`]) and that
    /// `b`, `h` and `t` are in range.
    pub(crate) fn kv_row_unchecked(&self, b: usize, h: u32, t: u32, value: bool) -> &[f32] {
        let p = self.shape.page;
        let page = self.table_unchecked(b)[(t / p) as usize] as u64;
        // Checked data's pool fits 32-bit rows: so do h, page and t's row.
        let row = h as u64 * self.pool_rows() as u64
            + page * 2 * p as u64
            + if value { p as u64 } else { 0 }
            + (t % p) as u64;
        let d = self.shape.d as usize;
        &self.kv[row as usize * d..(row as usize + 1) * d]
    }
}
