//! A picture of a run from its Chrome trace ([`crate::trace`]): the
//! swimlanes (one row per scheduler thread and per AICore; tasks coloured
//! by kernel, stalls in red on the scheduler lanes) and the cores'
//! utilisation over time, drawn headless into a PNG by `plotters`' bitmap
//! backend with an embedded font (DejaVu Sans Mono, under its own
//! permissive licence in `assets/fonts`): no system font libraries.
//!
//! The picture's layout is fixed by the number of lanes and kernels
//! ([`Geometry`]), so that tests can find each lane's pixels.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use plotters::prelude::*;
use plotters::style::{register_font, FontStyle, Palette, Palette99};
use serde_json::Value;

/// The embedded font (Bitstream Vera licence, see `assets/fonts`).
const FONT: &[u8] = include_bytes!("../assets/fonts/DejaVuSansMono.ttf");
/// The family name the font is registered under.
const FAMILY: &str = "sans-serif";

/// Width of the picture, in pixels.
pub const WIDTH: u32 = 1600;
const TITLE_H: u32 = 40;
const LABEL_W: u32 = 280;
const RIGHT: u32 = 30;
/// Height of one lane, in pixels; a bar fills all but `LANE_GAP` of it.
pub const LANE_H: u32 = 24;
const LANE_GAP: u32 = 4;
const AXIS_H: u32 = 30;
const UTIL_H: u32 = 240;
const LEGEND_ROW: u32 = 22;
const LEGEND_COLUMNS: usize = 4;
/// Bins of the utilisation plot.
const BINS: usize = 200;

/// Why a trace could not be drawn.
#[derive(Debug)]
pub enum PlotError {
    /// The input is not a trace this module understands.
    Trace(String),
    /// Drawing or writing the image failed.
    Draw(String),
}

impl fmt::Display for PlotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlotError::Trace(why) => write!(f, "not a pto-wsp Chrome trace: {why}"),
            PlotError::Draw(why) => write!(f, "drawing the picture: {why}"),
        }
    }
}

impl std::error::Error for PlotError {}

/// One interval on a lane.
#[derive(Clone, Debug)]
pub struct Span {
    /// Start, in trace microseconds.
    pub start: f64,
    /// End, in trace microseconds.
    pub end: f64,
    /// The kernel (a task) or the stall's reason.
    pub label: String,
    /// A stall, not a task.
    pub stall: bool,
}

/// One row of the picture.
#[derive(Clone, Debug)]
pub struct Lane {
    /// Its name in the trace.
    pub name: String,
    /// Whether it is an AICore's lane (else a scheduler thread's).
    pub core: bool,
    /// Its intervals.
    pub spans: Vec<Span>,
}

/// Lanes a plot draws at most: a run has at most
/// [`MAX_THREADS`](device_runtime::sched::MAX_THREADS) scheduler lanes and
/// [`MAX_RUN_CORES`](device_runtime::sched::MAX_RUN_CORES) core lanes. The
/// picture grows with the lanes, and past about 55,000 its pixels overflow
/// the drawing library's index; a trace with more is refused.
pub const MAX_LANES: usize = 1024;
/// Kernel names (colours in the legend) a plot draws at most.
pub const MAX_KERNELS: usize = 256;

/// The lanes of a trace, in the trace's lane order.
#[derive(Clone, Debug)]
pub struct Swimlanes {
    /// The run's name (the trace's process name).
    pub title: String,
    /// Whether the clock is semantic cycles (else wall time).
    pub semantic: bool,
    /// Every named lane.
    pub lanes: Vec<Lane>,
    /// Kernels in order of first appearance (their colours' order).
    pub kernels: Vec<String>,
}

impl Swimlanes {
    /// The lanes of Chrome trace `trace`: those named by `thread_name`
    /// events, scheduler lanes from 1000 on (see
    /// [`crate::trace::thread_lane`]), with their complete events.
    pub fn from_trace(trace: &Value) -> Result<Self, PlotError> {
        let events = trace["traceEvents"]
            .as_array()
            .ok_or_else(|| PlotError::Trace("no `traceEvents` array".into()))?;
        let mut lanes: BTreeMap<u64, (u64, Lane)> = BTreeMap::new();
        let mut title = String::from("pto-wsp run");
        for e in events.iter().filter(|e| e["ph"] == "M") {
            let tid = e["tid"].as_u64();
            match (e["name"].as_str(), tid) {
                (Some("process_name"), _) => {
                    if let Some(name) = e["args"]["name"].as_str() {
                        title = name.to_string();
                    }
                }
                (Some("thread_name"), Some(tid)) => {
                    let name = e["args"]["name"].as_str().unwrap_or("?").to_string();
                    let lane = &mut lanes.entry(tid).or_insert_with(|| (tid, empty(tid))).1;
                    lane.name = name;
                }
                (Some("thread_sort_index"), Some(tid)) => {
                    let sort = e["args"]["sort_index"].as_u64().unwrap_or(tid);
                    lanes.entry(tid).or_insert_with(|| (sort, empty(tid))).0 = sort;
                }
                _ => {}
            }
        }
        if lanes.len() > MAX_LANES {
            return Err(PlotError::Trace(format!(
                "{} named lanes; a plot draws at most {MAX_LANES}",
                lanes.len()
            )));
        }
        let mut kernels: Vec<String> = Vec::new();
        for e in events.iter().filter(|e| e["ph"] == "X") {
            let (Some(tid), Some(ts), Some(dur)) =
                (e["tid"].as_u64(), e["ts"].as_f64(), e["dur"].as_f64())
            else {
                return Err(PlotError::Trace(format!(
                    "a complete event without tid, ts or dur: {e}"
                )));
            };
            let Some((_, lane)) = lanes.get_mut(&tid) else {
                return Err(PlotError::Trace(format!(
                    "an event on lane {tid}, which has no name"
                )));
            };
            let stall = e["cat"] == "stall";
            let label = match (stall, e["args"]["kernel"].as_str()) {
                (false, Some(k)) => k,
                _ => e["name"].as_str().unwrap_or("?"),
            }
            .to_string();
            if !stall && !kernels.contains(&label) {
                if kernels.len() == MAX_KERNELS {
                    return Err(PlotError::Trace(format!(
                        "more than {MAX_KERNELS} kernel names; a plot tells at most {MAX_KERNELS} apart"
                    )));
                }
                kernels.push(label.clone());
            }
            lane.spans.push(Span {
                start: ts,
                end: ts + dur,
                label,
                stall,
            });
        }
        if lanes.is_empty() {
            return Err(PlotError::Trace("no named lanes".into()));
        }
        let mut lanes: Vec<(u64, Lane)> = lanes.into_values().collect();
        lanes.sort_by_key(|(sort, _)| *sort);
        Ok(Swimlanes {
            semantic: title.contains("semantic"),
            title,
            lanes: lanes.into_iter().map(|(_, l)| l).collect(),
            kernels,
        })
    }

    /// The earliest start and latest end of any span (0, 1 if none).
    fn extent(&self) -> (f64, f64) {
        let spans = self.lanes.iter().flat_map(|l| &l.spans);
        let start = spans.clone().map(|s| s.start).fold(f64::INFINITY, f64::min);
        let end = spans.map(|s| s.end).fold(f64::NEG_INFINITY, f64::max);
        if start.is_finite() && end > start {
            (start, end)
        } else {
            (0.0, 1.0)
        }
    }

    /// The picture's layout.
    pub fn geometry(&self) -> Geometry {
        Geometry::new(self.lanes.len(), self.kernels.len())
    }

    /// Draws the picture into the PNG file `path`.
    pub fn draw(&self, path: &Path) -> Result<(), PlotError> {
        let g = self.geometry();
        let draw = |e: &dyn fmt::Display| PlotError::Draw(e.to_string());
        fonts()?;
        let root = BitMapBackend::new(path, (g.width, g.height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw(&e))?;
        self.draw_lanes(&root, &g).map_err(|e| draw(&e))?;
        self.draw_utilisation(&root, &g).map_err(|e| draw(&e))?;
        self.draw_legend(&root, &g).map_err(|e| draw(&e))?;
        root.present().map_err(|e| draw(&e))?;
        Ok(())
    }

    /// The colour of kernel number `k`.
    fn colour(k: usize) -> RGBColor {
        let c = Palette99::pick(k).to_rgba();
        RGBColor(c.0, c.1, c.2)
    }

    fn kernel_index(&self, label: &str) -> usize {
        self.kernels.iter().position(|k| k == label).unwrap_or(0)
    }

    /// The time axis's unit and its size in trace microseconds: the
    /// larger unit once the run is longer than 10,000 of the smaller.
    fn unit(&self) -> (&'static str, f64) {
        let (_, end) = self.extent();
        match (self.semantic, end > 10_000.0) {
            (true, false) => ("thousand cycles", 1.0),
            (true, true) => ("million cycles", 1000.0),
            (false, false) => ("microseconds", 1.0),
            (false, true) => ("milliseconds", 1000.0),
        }
    }

    fn draw_lanes<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, plotters::coord::Shift>,
        g: &Geometry,
    ) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
        let (t0, t1) = self.extent();
        let x = |t: f64| g.x(t, t0, t1);
        let font = (FAMILY, 14).into_font();
        let title = (FAMILY, 18).into_font();
        root.draw(&Text::new(self.title.clone(), (10, 10), title))?;
        for (i, lane) in self.lanes.iter().enumerate() {
            let (y0, y1) = g.lane(i);
            let band = if i % 2 == 0 {
                RGBColor(246, 246, 246)
            } else {
                WHITE
            };
            root.draw(&Rectangle::new(
                [
                    (g.left as i32, y0 as i32),
                    (g.right as i32, y1 as i32 + LANE_GAP as i32),
                ],
                band.filled(),
            ))?;
            root.draw(&Text::new(
                lane.name.clone(),
                (6, y0 as i32 + 3),
                font.clone(),
            ))?;
            for s in &lane.spans {
                let colour = if s.stall {
                    RGBColor(220, 30, 30)
                } else {
                    Self::colour(self.kernel_index(&s.label))
                };
                // At least a pixel wide: a short task still shows; a wide
                // one starts with a pale pixel, to tell it from the task
                // before it.
                let (a, b) = (x(s.start), x(s.end).max(x(s.start) + 1));
                root.draw(&Rectangle::new(
                    [(a as i32, y0 as i32), (b as i32, y1 as i32)],
                    colour.filled(),
                ))?;
                if b > a + 3 {
                    root.draw(&Rectangle::new(
                        [(a as i32, y0 as i32), (a as i32 + 1, y1 as i32)],
                        WHITE.mix(0.6).filled(),
                    ))?;
                }
            }
        }
        // The time axis under the lanes: five ticks.
        let axis_y = g.lanes_bottom as i32 + 4;
        let (unit, scale) = self.unit();
        for k in 0..=4 {
            let t = t0 + (t1 - t0) * k as f64 / 4.0;
            let px = x(t) as i32;
            root.draw(&PathElement::new(
                vec![(px, axis_y - 4), (px, axis_y + 2)],
                BLACK,
            ))?;
            let label = format!("{:.1}", t / scale);
            // Centred under its tick (the font is monospaced, ~8 px a
            // character), the last one ending at the axis's end.
            let w = 8 * label.len() as i32;
            let at = if k == 4 { px - w } else { px - w / 2 };
            root.draw(&Text::new(label, (at, axis_y + 4), font.clone()))?;
        }
        // The unit left of the axis, under the lane names.
        let at = g.left as i32 - 8 * unit.len() as i32 - 30;
        root.draw(&Text::new(unit.to_string(), (at, axis_y + 4), font))?;
        Ok(())
    }

    /// Per core and for all cores, the share of each bin of time the
    /// core was running a task.
    pub fn utilisation(&self, bins: usize) -> (Vec<Vec<f64>>, Vec<f64>) {
        let (t0, t1) = self.extent();
        let width = (t1 - t0) / bins as f64;
        let cores: Vec<&Lane> = self.lanes.iter().filter(|l| l.core).collect();
        let per_core: Vec<Vec<f64>> = cores
            .iter()
            .map(|lane| {
                let mut busy = vec![0.0; bins];
                for s in lane.spans.iter().filter(|s| !s.stall) {
                    let first = (((s.start - t0) / width) as usize).min(bins - 1);
                    let last = (((s.end - t0) / width) as usize).min(bins - 1);
                    for (b, slot) in busy.iter_mut().enumerate().take(last + 1).skip(first) {
                        let (lo, hi) = (t0 + b as f64 * width, t0 + (b + 1) as f64 * width);
                        let overlap = s.end.min(hi) - s.start.max(lo);
                        *slot += overlap.max(0.0) / width;
                    }
                }
                busy.iter().map(|b| b.min(1.0)).collect()
            })
            .collect();
        let all = (0..bins)
            .map(|b| per_core.iter().map(|c| c[b]).sum::<f64>() / per_core.len().max(1) as f64)
            .collect();
        (per_core, all)
    }

    fn draw_utilisation<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, plotters::coord::Shift>,
        g: &Geometry,
    ) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
        let (t0, t1) = self.extent();
        let area = root.margin(g.util_top, g.height - g.util_bottom, 0, 0);
        let (unit, scale) = self.unit();
        let (t0, t1) = (t0 / scale, t1 / scale);
        let mut chart = ChartBuilder::on(&area)
            .caption(
                "core utilisation (all cores: black; each core: colour)",
                (FAMILY, 15),
            )
            .margin_right(RIGHT)
            .x_label_area_size(30)
            .y_label_area_size(LABEL_W - 10)
            .build_cartesian_2d(t0..t1, 0.0..100.0)?;
        chart
            .configure_mesh()
            .x_desc(unit)
            .y_desc("% busy")
            .x_labels(5)
            .y_labels(5)
            .label_style((FAMILY, 13))
            .draw()?;
        let (per_core, all) = self.utilisation(BINS);
        let mid = |b: usize| t0 + (t1 - t0) * (b as f64 + 0.5) / BINS as f64;
        for (c, busy) in per_core.iter().enumerate() {
            let colour = Self::colour(c + self.kernels.len()).mix(0.5);
            let points = busy.iter().enumerate().map(|(b, u)| (mid(b), u * 100.0));
            chart.draw_series(LineSeries::new(points, colour.stroke_width(1)))?;
        }
        let points = all.iter().enumerate().map(|(b, u)| (mid(b), u * 100.0));
        chart.draw_series(LineSeries::new(points, BLACK.stroke_width(2)))?;
        Ok(())
    }

    fn draw_legend<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, plotters::coord::Shift>,
        g: &Geometry,
    ) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
        let font = (FAMILY, 14).into_font();
        let column = (g.width - 20) / LEGEND_COLUMNS as u32;
        let entries = self
            .kernels
            .iter()
            .enumerate()
            .map(|(k, name)| (name.clone(), Self::colour(k)))
            .chain([("stall (scheduler lane)".to_string(), RGBColor(220, 30, 30))]);
        for (i, (name, colour)) in entries.enumerate() {
            let x = 10 + (i % LEGEND_COLUMNS) as u32 * column;
            let y = g.legend_top + (i / LEGEND_COLUMNS) as u32 * LEGEND_ROW;
            root.draw(&Rectangle::new(
                [(x as i32, y as i32 + 3), (x as i32 + 14, y as i32 + 17)],
                colour.filled(),
            ))?;
            root.draw(&Text::new(
                name,
                (x as i32 + 20, y as i32 + 2),
                font.clone(),
            ))?;
        }
        Ok(())
    }
}

fn empty(tid: u64) -> Lane {
    Lane {
        name: format!("lane {tid}"),
        core: tid < crate::trace::thread_lane(0) as u64,
        spans: Vec::new(),
    }
}

/// Registers the embedded font (again: registering replaces).
fn fonts() -> Result<(), PlotError> {
    register_font(FAMILY, FontStyle::Normal, FONT)
        .map_err(|_| PlotError::Draw("the embedded font does not load".into()))
}

/// Where things are in the picture, in pixels from the top left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// The image's width.
    pub width: u32,
    /// The image's height.
    pub height: u32,
    /// The column of the lanes' first instant.
    pub left: u32,
    /// The column of their last.
    pub right: u32,
    /// The first lane's top.
    pub lanes_top: u32,
    /// Below the last lane.
    pub lanes_bottom: u32,
    /// The utilisation plot's first row.
    pub util_top: u32,
    /// Below its last row.
    pub util_bottom: u32,
    /// The legend's first row.
    pub legend_top: u32,
}

impl Geometry {
    /// The layout for `lanes` lanes and `kernels` kernels.
    pub fn new(lanes: usize, kernels: usize) -> Self {
        let lanes_top = TITLE_H;
        let lanes_bottom = lanes_top + lanes as u32 * LANE_H;
        let util_top = lanes_bottom + AXIS_H;
        let util_bottom = util_top + UTIL_H;
        let legend_top = util_bottom + 10;
        let rows = (kernels + 1).div_ceil(LEGEND_COLUMNS) as u32;
        Geometry {
            width: WIDTH,
            height: legend_top + rows * LEGEND_ROW + 10,
            left: LABEL_W,
            right: WIDTH - RIGHT,
            lanes_top,
            lanes_bottom,
            util_top,
            util_bottom,
            legend_top,
        }
    }

    /// Rows `y0 ..= y1` of lane `i`'s bars.
    pub fn lane(&self, i: usize) -> (u32, u32) {
        let y0 = self.lanes_top + i as u32 * LANE_H;
        (y0, y0 + LANE_H - LANE_GAP - 1)
    }

    /// The column of time `t` on an axis from `t0` to `t1`.
    pub fn x(&self, t: f64, t0: f64, t1: f64) -> u32 {
        let span = (self.right - self.left) as f64;
        let f = ((t - t0) / (t1 - t0)).clamp(0.0, 1.0);
        self.left + (f * span).round() as u32
    }
}
