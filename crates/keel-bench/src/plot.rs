//! Line plots for the benchmark reports, drawn with `plotters` into an RGB buffer and
//! encoded as PNG with `png`. Text is set in DejaVu Sans, embedded (`assets/`, with its
//! licence), so no system font library is needed.
//!
//! A [`Plot`] reads on its own: a title, axis titles, tick labels with the decimals their
//! step needs (`0.0 … 1.0` on a CDF), light grid lines, and a legend naming each series in
//! its colour, in the corner of the plot area the lines cover least. The y axis may be
//! logarithmic (latency); the x axis is linear or a list of labels (percentiles).

use plotters::prelude::*;

/// Width and height of every plot, in pixels.
pub const PLOT_SIZE: (usize, usize) = (960, 600);
/// Most series one plot draws (the palette's size).
pub const SERIES_MAX: usize = 12;

/// Series colors, in order.
pub const PALETTE: [[u8; 3]; SERIES_MAX] = [
    [31, 119, 180],
    [255, 127, 14],
    [44, 160, 44],
    [214, 39, 40],
    [148, 103, 189],
    [140, 86, 75],
    [227, 119, 194],
    [127, 127, 127],
    [188, 189, 34],
    [23, 190, 207],
    [0, 0, 0],
    [120, 200, 120],
];

/// The family name the embedded font is registered under.
const FONT: &str = "keel-sans";
/// DejaVu Sans (Bitstream Vera licence, `assets/DejaVuSans-LICENSE.txt`).
const FONT_BYTES: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

fn register_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, FONT_BYTES)
            .unwrap_or_else(|_| panic!("the embedded font parses"));
    });
}

/// A short label for a number: `950`, `1.2k`, `35k`, `1.5M`, `0.25`.
pub fn short_number(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{:.1}M", v / 1e6).replace(".0M", "M")
    } else if a >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if a >= 1e3 {
        format!("{:.1}k", v / 1e3).replace(".0k", "k")
    } else if a >= 10.0 || v == v.round() {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// Ticks of a linear axis covering `lo..=hi`: about five at a step of 1, 2 or 5 times a
/// power of ten, the axis widened to whole steps. Labels carry the decimals the step
/// needs (`0.0, 0.2, … 1.0`). Returns the widened range and `(value, label)` per tick.
pub fn linear_ticks(lo: f64, hi: f64) -> ((f64, f64), Vec<(f64, String)>) {
    assert!(lo.is_finite() && hi.is_finite() && lo <= hi, "axis {lo}..{hi}");
    let (lo, hi) = if hi > lo { (lo, hi) } else { (lo - 1.0, hi + 1.0) };
    let raw = (hi - lo) / 5.0;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= raw * 0.999)
        .unwrap_or(10.0 * magnitude);
    let (first, last) = ((lo / step).floor(), (hi / step).ceil());
    let decimals = (-step.log10().floor()).max(0.0) as usize;
    let count = (last - first) as usize;
    let ticks = (0..=count)
        .map(|i| {
            let v = (first + i as f64) * step;
            let label = if v.abs() >= 1e4 { short_number(v) } else { format!("{v:.decimals$}") };
            (v, label)
        })
        .collect();
    ((first * step, last * step), ticks)
}

/// Ticks of a logarithmic axis covering `lo..=hi` (both > 0): every power of ten, the
/// axis widened to whole decades, plus 2× and 5× when it spans at most two decades.
pub fn log_ticks(lo: f64, hi: f64) -> ((f64, f64), Vec<(f64, String)>) {
    assert!(lo > 0.0 && hi >= lo, "log axis {lo}..{hi}");
    let first = lo.log10().floor() as i32;
    let last = (hi.log10().ceil() as i32).max(first + 1);
    let mut ticks = Vec::new();
    for d in first..=last {
        let base = 10f64.powi(d);
        ticks.push((base, short_number(base)));
        if last - first <= 2 && d < last {
            ticks.extend([2.0, 5.0].map(|m| (m * base, short_number(m * base))));
        }
    }
    ((10f64.powi(first), 10f64.powi(last)), ticks)
}

/// One line of a plot: its name in the legend, and its points.
#[derive(Clone, Debug, Default)]
pub struct Series {
    /// The legend's text.
    pub name: String,
    /// `(x, y)` points, drawn in order.
    pub points: Vec<(f64, f64)>,
}

/// A line plot; [`Plot::to_png`] renders it.
#[derive(Clone, Debug, Default)]
pub struct Plot {
    /// Above the plot.
    pub title: String,
    /// Below the x axis, e.g. `latency (ms)`.
    pub x_title: String,
    /// Beside the y axis (read bottom to top), e.g. `cumulative fraction`.
    pub y_title: String,
    /// Logarithmic y axis; points with y <= 0 are dropped.
    pub log_y: bool,
    /// Labels of x = 0, 1, 2 ... instead of numeric ticks.
    pub x_labels: Option<Vec<String>>,
    /// At most [`SERIES_MAX`], colored by [`PALETTE`] in order.
    pub series: Vec<Series>,
}

/// Where a plot's legend went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Corner {
    /// Top left of the plot area.
    UpperLeft,
    /// Top right.
    UpperRight,
    /// Bottom left.
    LowerLeft,
    /// Bottom right.
    LowerRight,
}

impl Plot {
    /// The plot as a PNG file's bytes.
    pub fn to_png(&self) -> Vec<u8> {
        let (w, h) = PLOT_SIZE;
        let mut png = Vec::new();
        let mut encoder = png::Encoder::new(&mut png, w as u32, h as u32);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder.write_header().expect("writing to a Vec");
        writer.write_image_data(&self.draw().0).expect("the buffer matches the size");
        writer.finish().expect("writing to a Vec");
        png
    }

    /// The plot as RGB pixels, row by row, and where its legend went (`None`: no named
    /// series).
    pub fn draw(&self) -> (Vec<u8>, Option<Corner>) {
        assert!(self.series.len() <= SERIES_MAX, "at most {SERIES_MAX} series");
        register_font();
        let (w, h) = PLOT_SIZE;
        let mut rgb = vec![255u8; w * h * 3];
        let corner = {
            let root =
                BitMapBackend::with_buffer(&mut rgb, (w as u32, h as u32)).into_drawing_area();
            let corner = self.draw_on(&root).expect("drawing into a buffer");
            root.present().expect("drawing into a buffer");
            corner
        };
        (rgb, corner)
    }

    /// y as drawn: its logarithm on a log axis.
    fn ty(&self, y: f64) -> f64 {
        if self.log_y {
            y.log10()
        } else {
            y
        }
    }

    fn draw_on(
        &self,
        root: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    ) -> Result<Option<Corner>, Box<dyn std::error::Error + '_>> {
        root.fill(&WHITE)?;
        let kept = |y: f64| !self.log_y || y > 0.0;
        let series: Vec<Vec<(f64, f64)>> = self
            .series
            .iter()
            .map(|s| s.points.iter().filter(|p| kept(p.1)).map(|&(x, y)| (x, self.ty(y))).collect())
            .collect();
        let points: Vec<(f64, f64)> =
            self.series.iter().flat_map(|s| &s.points).filter(|p| kept(p.1)).copied().collect();
        let fold = |f: fn(&(f64, f64)) -> f64| {
            points.iter().map(f).fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(v), b.max(v)))
        };
        let ((y0, y1), y_ticks) = match (points.is_empty(), self.log_y) {
            (true, false) => linear_ticks(0.0, 1.0),
            (true, true) => log_ticks(1.0, 10.0),
            (false, false) => {
                let (lo, hi) = fold(|p| p.1);
                linear_ticks(lo, hi)
            }
            (false, true) => {
                let (lo, hi) = fold(|p| p.1);
                log_ticks(lo, hi)
            }
        };
        let ((x0, x1), x_ticks): ((f64, f64), Vec<(f64, String)>) = match &self.x_labels {
            Some(labels) => (
                (-0.3, labels.len().max(1) as f64 - 0.7),
                labels.iter().enumerate().map(|(i, l)| (i as f64, l.clone())).collect(),
            ),
            None if points.is_empty() => linear_ticks(0.0, 1.0),
            None => {
                let (lo, hi) = fold(|p| p.0);
                linear_ticks(lo, hi)
            }
        };
        let (ty0, ty1) = (self.ty(y0), self.ty(y1));
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, (FONT, 24))
            .margin(16)
            .x_label_area_size(56)
            .y_label_area_size(84)
            .build_cartesian_2d(x0..x1, ty0..ty1)?;
        // Tick labels only where `linear_ticks`/`log_ticks` put a tick (grid lines at
        // every key point plotters picks).
        let label_at = |ticks: &[(f64, String)], v: f64, log: bool| {
            let near = |t: f64| {
                let t = if log { t.log10() } else { t };
                (t - v).abs() <= 1e-6 * (1.0 + t.abs())
            };
            ticks.iter().find(|(t, _)| near(*t)).map_or(String::new(), |(_, l)| l.clone())
        };
        let x_key = |v: &f64| label_at(&x_ticks, *v, false);
        let y_key = |v: &f64| label_at(&y_ticks, *v, self.log_y);
        let x_count = if self.x_labels.is_some() { x_ticks.len() } else { x_ticks.len() * 2 };
        chart
            .configure_mesh()
            .x_desc(self.x_title.as_str())
            .y_desc(self.y_title.as_str())
            .x_labels(x_count.max(2))
            .y_labels(y_ticks.len().max(2) * 4)
            .x_label_formatter(&x_key)
            .y_label_formatter(&y_key)
            .label_style((FONT, 16))
            .axis_desc_style((FONT, 18))
            .light_line_style(RGBColor(240, 240, 240))
            .bold_line_style(RGBColor(220, 220, 220))
            .draw()?;
        for (i, (points, named)) in series.iter().zip(&self.series).enumerate() {
            let [r, g, b] = PALETTE[i];
            let color = RGBColor(r, g, b);
            let drawn =
                chart.draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?;
            if !named.name.is_empty() {
                drawn.label(named.name.as_str()).legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(4))
                });
            }
            if points.len() <= 20 {
                chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
            }
        }
        if self.series.iter().all(|s| s.name.is_empty()) {
            return Ok(None);
        }
        let names: Vec<&str> =
            self.series.iter().map(|s| s.name.as_str()).filter(|n| !n.is_empty()).collect();
        let corner = emptiest_corner(&series, &names, (x0, x1), (ty0, ty1));
        let position = match corner {
            Corner::UpperLeft => SeriesLabelPosition::UpperLeft,
            Corner::UpperRight => SeriesLabelPosition::UpperRight,
            Corner::LowerLeft => SeriesLabelPosition::LowerLeft,
            Corner::LowerRight => SeriesLabelPosition::LowerRight,
        };
        chart
            .configure_series_labels()
            .position(position)
            .margin(12)
            .label_font((FONT, 16))
            .background_style(WHITE.mix(0.92))
            .border_style(BLACK)
            .draw()?;
        Ok(Some(corner))
    }
}

/// The corner of the plot area where a legend of `names` covers the fewest line samples
/// (the box's size estimated from the font's size and the longest name).
fn emptiest_corner(
    series: &[Vec<(f64, f64)>],
    names: &[&str],
    x: (f64, f64),
    y: (f64, f64),
) -> Corner {
    // The plot area is about 840 × 470 pixels; a legend row is 24 pixels high and a
    // character about 9 wide, after a 40-pixel swatch, inside a 12-pixel margin.
    let chars = names.iter().map(|n| n.chars().count()).max().unwrap_or(0) as f64;
    let (box_w, box_h) = ((chars * 9.0 + 64.0) / 840.0, (names.len() as f64 * 24.0 + 28.0) / 470.0);
    let unit = |v: f64, (lo, hi): (f64, f64)| if hi > lo { (v - lo) / (hi - lo) } else { 0.5 };
    let corners = [Corner::UpperRight, Corner::UpperLeft, Corner::LowerRight, Corner::LowerLeft];
    let inside = |corner: Corner, px: f64, py: f64| {
        let in_x = match corner {
            Corner::UpperLeft | Corner::LowerLeft => px <= box_w,
            Corner::UpperRight | Corner::LowerRight => px >= 1.0 - box_w,
        };
        let in_y = match corner {
            Corner::UpperLeft | Corner::UpperRight => py >= 1.0 - box_h,
            Corner::LowerLeft | Corner::LowerRight => py <= box_h,
        };
        in_x && in_y
    };
    let mut counts = [0usize; 4];
    for points in series {
        let samples = points.windows(2).flat_map(|pair| {
            (0..=32).map(move |k| {
                let t = f64::from(k) / 32.0;
                (pair[0].0 + (pair[1].0 - pair[0].0) * t, pair[0].1 + (pair[1].1 - pair[0].1) * t)
            })
        });
        for (sx, sy) in samples.chain(points.iter().copied()) {
            let (px, py) = (unit(sx, x), unit(sy, y));
            for (i, corner) in corners.iter().enumerate() {
                counts[i] += usize::from(inside(*corner, px, py));
            }
        }
    }
    // The fewest covered; ties in the order above (upper right first, as plots usually read).
    let best = (0..4).min_by_key(|&i| counts[i]).unwrap_or(0);
    corners[best]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_short_and_ticks_carry_the_decimals_they_need() {
        assert_eq!(short_number(950.0), "950");
        assert_eq!(short_number(1_234.0), "1.2k");
        assert_eq!(short_number(2_000.0), "2k");
        assert_eq!(short_number(35_000.0), "35k");
        assert_eq!(short_number(1_500_000.0), "1.5M");
        assert_eq!(short_number(0.5), "0.5");
        let ((lo, hi), ticks) = linear_ticks(0.0, 1.0);
        let labels: Vec<&str> = ticks.iter().map(|(_, l)| l.as_str()).collect();
        assert_eq!((lo, hi), (0.0, 1.0));
        assert_eq!(labels, ["0.0", "0.2", "0.4", "0.6", "0.8", "1.0"]);
        let ((lo, hi), ticks) = linear_ticks(2.1, 79.0);
        assert_eq!((lo, hi), (0.0, 80.0));
        assert_eq!(ticks[1].1, "20");
        let ((lo, hi), ticks) = log_ticks(2_000.0, 80_000.0);
        assert_eq!((lo, hi), (1_000.0, 100_000.0));
        assert!(ticks.iter().any(|(v, l)| *v == 5_000.0 && l == "5k"), "{ticks:?}");
    }

    fn three_series() -> Plot {
        let cdf = |shift: f64| (0..=10).map(move |i| (shift + f64::from(i), f64::from(i) / 10.0));
        Plot {
            title: "CDF".into(),
            x_title: "latency (ms)".into(),
            y_title: "cumulative fraction".into(),
            log_y: false,
            x_labels: None,
            series: ["strong, leader", "weak, leader", "cad, leader"]
                .iter()
                .enumerate()
                .map(|(i, n)| Series { name: n.to_string(), points: cdf(i as f64 * 5.0).collect() })
                .collect(),
        }
    }

    /// Pixels of `color` in the rectangle `x0..x1 × y0..y1` of an RGB image.
    fn count(rgb: &[u8], color: [u8; 3], (x0, y0, x1, y1): (usize, usize, usize, usize)) -> usize {
        let w = PLOT_SIZE.0;
        (y0..y1)
            .flat_map(|y| (x0..x1).map(move |x| (x, y)))
            .filter(|&(x, y)| rgb[(y * w + x) * 3..(y * w + x) * 3 + 3] == color)
            .count()
    }

    #[test]
    fn the_legend_names_each_series_in_its_colour_where_the_lines_are_not() {
        let plot = three_series();
        let (rgb, corner) = plot.draw();
        // The CDFs rise from bottom left to top right: the legend goes to the upper left
        // or the lower right, where no line passes.
        let (w, h) = PLOT_SIZE;
        let area = match corner {
            Some(Corner::UpperLeft) => (0, 0, w / 2, h / 2),
            Some(Corner::LowerRight) => (w / 2, h / 2, w, h),
            other => panic!("the legend went to {other:?}, over the lines"),
        };
        let mut bare = plot.clone();
        bare.series.iter_mut().for_each(|s| s.name.clear());
        let (lines, none) = bare.draw();
        assert!(none.is_none(), "unnamed series get no legend");
        for color in &PALETTE[..3] {
            // A swatch in the series' colour where the legend went.
            let added = count(&rgb, *color, area) - count(&lines, *color, area);
            assert!(added > 40, "colour {color:?}: {added} more pixels with the legend");
        }
    }

    #[test]
    fn plots_draw_titles_lines_and_log_axes_into_a_png() {
        let plot = Plot {
            title: "p99".into(),
            log_y: true,
            x_labels: Some(vec!["50".into(), "99".into()]),
            series: vec![
                Series { name: String::new(), points: vec![(0.0, 10.0), (1.0, 100.0)] },
                Series { name: String::new(), points: vec![(0.0, 5.0), (1.0, 0.0)] },
            ],
            ..Plot::default()
        };
        let (rgb, _) = plot.draw();
        let (w, h) = PLOT_SIZE;
        assert!(count(&rgb, PALETTE[0], (0, 0, w, h)) > 100, "the first line is drawn");
        assert!(count(&rgb, PALETTE[1], (0, 0, w, h)) > 10, "a single kept point gets a marker");
        // The title is set near the top centre.
        let ink = (400..560)
            .flat_map(|x| (0..40).map(move |y| (x, y)))
            .filter(|&(x, y)| rgb[(y * w + x) * 3] < 128)
            .count();
        assert!(ink > 20, "title ink: {ink}");
        // The PNG decodes to the same pixels: its size, 8-bit RGB, both series' colours.
        let png = plot.to_png();
        let mut reader = png::Decoder::new(std::io::Cursor::new(png)).read_info().expect("a PNG");
        let mut decoded = vec![0; reader.output_buffer_size()];
        let frame = reader.next_frame(&mut decoded).expect("its pixels decode");
        assert_eq!((frame.width as usize, frame.height as usize), PLOT_SIZE);
        assert_eq!(
            (frame.color_type, frame.bit_depth),
            (png::ColorType::Rgb, png::BitDepth::Eight)
        );
        decoded.truncate(frame.buffer_size());
        assert_eq!(decoded, rgb, "the PNG holds what was drawn");
        assert_eq!(Plot::default().draw().0.len(), w * h * 3, "an empty plot still draws");
    }
}
