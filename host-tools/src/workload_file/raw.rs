//! The file as serde reads it.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use toml::Spanned;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFile {
    pub(super) name: Option<String>,
    pub(super) summary: Option<String>,
    #[serde(default)]
    pub(super) symbols: BTreeMap<String, Spanned<RawSymbol>>,
    #[serde(default)]
    pub(super) tensors: BTreeMap<String, Spanned<RawTensor>>,
    #[serde(default)]
    pub(super) channels: BTreeMap<String, Spanned<RawChannel>>,
    #[serde(default)]
    pub(super) body: Vec<Spanned<RawNode>>,
    pub(super) schedule: Option<Spanned<RawSchedule>>,
}

/// `[channels]`: `name = { depth = N, latency = T }`, in file order
/// (channel 0 first).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawChannel {
    pub(super) depth: Option<Spanned<u32>>,
    pub(super) latency: Option<Spanned<u32>>,
}

/// `[schedule]`: settings of the whole workload (per-body dispatch is a
/// `dispatch` entry).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSchedule {
    pub(super) window: Option<Spanned<u32>>,
    /// Bytes of the heap ring for scratch tensors.
    pub(super) heap: Option<Spanned<u64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSymbol {
    pub(super) max: u32,
    pub(super) default: Option<i64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTensor {
    pub(super) dtype: Option<String>,
    pub(super) shape: Vec<u32>,
    pub(super) init: Option<String>,
    pub(super) seed: Option<u64>,
    pub(super) skip: Option<u64>,
    pub(super) scale: Option<f64>,
    pub(super) range: Option<[i64; 2]>,
    pub(super) values: Option<Vec<f64>>,
    pub(super) input: Option<bool>,
    /// An intermediate whose storage the heap ring lends while it is live.
    pub(super) scratch: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNode {
    pub(super) parallel: Option<Spanned<String>>,
    pub(super) sequential: Option<Spanned<String>>,
    pub(super) select: Option<Spanned<String>>,
    pub(super) when: Option<Spanned<ExprSrc>>,
    #[serde(rename = "let")]
    pub(super) let_: Option<Spanned<String>>,
    pub(super) call: Option<Spanned<String>>,
    pub(super) dispatch: Option<Spanned<String>>,
    pub(super) key: Option<Spanned<String>>,
    pub(super) record: Option<Spanned<u32>>,
    pub(super) wait: Option<Spanned<u32>>,
    pub(super) stream: Option<Spanned<u32>>,
    pub(super) dense: Option<Spanned<u32>>,
    pub(super) dense_dyn: Option<Spanned<String>>,
    pub(super) ragged: Option<Spanned<RawRagged>>,
    pub(super) max: Option<Spanned<u32>>,
    pub(super) slot: Option<Spanned<String>>,
    pub(super) indptr: Option<Spanned<String>>,
    pub(super) indices: Option<Spanned<String>>,
    pub(super) row: Option<Spanned<ExprSrc>>,
    pub(super) value: Option<Spanned<ExprSrc>>,
    pub(super) then: Option<Vec<Spanned<RawNode>>>,
    pub(super) otherwise: Option<Vec<Spanned<RawNode>>>,
    pub(super) args: Option<Vec<Spanned<ArgSrc>>>,
    pub(super) scalars: Option<Vec<Spanned<ExprSrc>>>,
    pub(super) body: Option<Vec<Spanned<RawNode>>>,
    pub(super) label: Option<Spanned<String>>,
    pub(super) process: Option<Spanned<String>>,
    pub(super) replica: Option<Spanned<String>>,
    pub(super) send: Option<Spanned<String>>,
    pub(super) after: Option<Spanned<String>>,
    pub(super) consume: Option<Spanned<String>>,
    #[serde(rename = "as")]
    pub(super) as_: Option<Spanned<String>>,
    pub(super) close: Option<Spanned<String>>,
    /// `free = "tensor"`: ends a scratch tensor's scope.
    pub(super) free: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRagged {
    pub(super) lengths: Spanned<String>,
    pub(super) at: Vec<Spanned<ExprSrc>>,
    pub(super) max: u32,
}

/// An expression as written: an integer, a float (kernel scalars only:
/// passed as f32 bits) or an expression string.
#[derive(Clone, Debug)]
pub(super) enum ExprSrc {
    Int(i64),
    Float(f64),
    Text(String),
}

impl<'de> Deserialize<'de> for ExprSrc {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ExprSrc;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an integer, a float (kernel scalars) or an expression string")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ExprSrc, E> {
                Ok(ExprSrc::Int(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ExprSrc, E> {
                i64::try_from(v)
                    .map(ExprSrc::Int)
                    .map_err(|_| E::custom("integer too large"))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<ExprSrc, E> {
                Ok(ExprSrc::Float(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ExprSrc, E> {
                Ok(ExprSrc::Text(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

/// A kernel argument as written: `"t[row, col; rows x cols]"`, `"t"` (the
/// whole tensor) or `{ tensor = "t", at = [..], rows = .., cols = .. }`.
pub(super) enum ArgSrc {
    Text(String),
    Table(RawRegion),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRegion {
    pub(super) tensor: String,
    pub(super) at: Vec<Spanned<ExprSrc>>,
    pub(super) rows: Option<Spanned<ExprSrc>>,
    pub(super) cols: Spanned<ExprSrc>,
}

impl<'de> Deserialize<'de> for ArgSrc {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ArgSrc;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "a region string \"t[row, col; rows x cols]\" or a table { tensor, at, rows, cols }",
                )
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ArgSrc, E> {
                Ok(ArgSrc::Text(v.to_string()))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ArgSrc, A::Error> {
                RawRegion::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(ArgSrc::Table)
            }
        }
        d.deserialize_any(V)
    }
}

impl RawNode {
    /// The keys present, by name.
    pub(super) fn keys(&self) -> Vec<&'static str> {
        let present = [
            ("parallel", self.parallel.is_some()),
            ("sequential", self.sequential.is_some()),
            ("select", self.select.is_some()),
            ("when", self.when.is_some()),
            ("let", self.let_.is_some()),
            ("call", self.call.is_some()),
            ("dispatch", self.dispatch.is_some()),
            ("key", self.key.is_some()),
            ("record", self.record.is_some()),
            ("wait", self.wait.is_some()),
            ("stream", self.stream.is_some()),
            ("dense", self.dense.is_some()),
            ("dense_dyn", self.dense_dyn.is_some()),
            ("ragged", self.ragged.is_some()),
            ("max", self.max.is_some()),
            ("slot", self.slot.is_some()),
            ("indptr", self.indptr.is_some()),
            ("indices", self.indices.is_some()),
            ("row", self.row.is_some()),
            ("value", self.value.is_some()),
            ("then", self.then.is_some()),
            ("otherwise", self.otherwise.is_some()),
            ("args", self.args.is_some()),
            ("scalars", self.scalars.is_some()),
            ("body", self.body.is_some()),
            ("label", self.label.is_some()),
            ("process", self.process.is_some()),
            ("replica", self.replica.is_some()),
            ("send", self.send.is_some()),
            ("after", self.after.is_some()),
            ("consume", self.consume.is_some()),
            ("as", self.as_.is_some()),
            ("close", self.close.is_some()),
            ("free", self.free.is_some()),
        ];
        present
            .iter()
            .filter(|(_, p)| *p)
            .map(|(k, _)| *k)
            .collect()
    }
}
