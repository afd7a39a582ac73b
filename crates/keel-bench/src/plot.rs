//! Minimal PNG plots, written without a plotting library: an RGB canvas with lines and
//! text in a 5×9 bitmap font ([`crate::font`]), and a PNG encoder ("Up" filter, one
//! fixed-Huffman deflate block coding byte runs as distance-1 matches, CRC-32, Adler-32).
//!
//! A [`Plot`] is a line plot that reads on its own: a title, axis titles, tick labels
//! with the decimals their step needs (`0.0 … 1.0` on a CDF), light grid lines, and a
//! legend box inside the plot area naming each series in its colour. The legend sits in
//! the corner of the plot area the lines cover least. The y axis may be logarithmic
//! (latency); the x axis is linear or a list of labels (percentiles).

use crate::font;

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

const WHITE: [u8; 3] = [255; 3];
const BLACK: [u8; 3] = [0; 3];
const GRID: [u8; 3] = [228; 3];

/// An RGB image.
#[derive(Clone, Debug)]
pub struct Canvas {
    width: usize,
    height: usize,
    pixels: Vec<[u8; 3]>,
}

/// A rectangle of pixels, corners included.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rect {
    /// Left column.
    pub x0: i64,
    /// Top row.
    pub y0: i64,
    /// Right column.
    pub x1: i64,
    /// Bottom row.
    pub y1: i64,
}

impl Canvas {
    /// A white canvas.
    pub fn new(width: usize, height: usize) -> Canvas {
        assert!(width > 0 && height > 0 && width * height <= 1 << 24, "canvas {width}x{height}");
        Canvas { width, height, pixels: vec![WHITE; width * height] }
    }

    /// Sets one pixel; outside the canvas: ignored.
    pub fn set(&mut self, x: i64, y: i64, color: [u8; 3]) {
        if x >= 0 && y >= 0 && (x as usize) < self.width && (y as usize) < self.height {
            self.pixels[y as usize * self.width + x as usize] = color;
        }
    }

    /// One pixel; `None` outside the canvas.
    pub fn get(&self, x: i64, y: i64) -> Option<[u8; 3]> {
        (x >= 0 && y >= 0 && (x as usize) < self.width && (y as usize) < self.height)
            .then(|| self.pixels[y as usize * self.width + x as usize])
    }

    /// Fills `r` with `color`.
    pub fn fill(&mut self, r: Rect, color: [u8; 3]) {
        for y in r.y0..=r.y1 {
            for x in r.x0..=r.x1 {
                self.set(x, y, color);
            }
        }
    }

    /// A one-pixel line (Bresenham).
    pub fn thin_line(&mut self, from: (i64, i64), to: (i64, i64), color: [u8; 3]) {
        let (mut x, mut y) = from;
        let (dx, dy) = ((to.0 - x).abs(), -(to.1 - y).abs());
        let (sx, sy) = (if x < to.0 { 1 } else { -1 }, if y < to.1 { 1 } else { -1 });
        let mut err = dx + dy;
        // Bounded: each pass moves one pixel closer; at most dx - dy + 1 passes.
        for _ in 0..=(dx - dy) {
            self.set(x, y, color);
            if (x, y) == to {
                break;
            }
            let e2 = 2 * err;
            if e2 >= dy {
                err += dy;
                x += sx;
            }
            if e2 <= dx {
                err += dx;
                y += sy;
            }
        }
    }

    /// A line two pixels thick, whatever its slope.
    pub fn line(&mut self, from: (i64, i64), to: (i64, i64), color: [u8; 3]) {
        for (dx, dy) in [(0, 0), (1, 0), (0, 1)] {
            self.thin_line((from.0 + dx, from.1 + dy), (to.0 + dx, to.1 + dy), color);
        }
    }

    /// Text with its top-left corner at `(x, y)`, each font pixel `scale`×`scale`;
    /// characters outside the font are drawn as `?`.
    pub fn text(&mut self, x: i64, y: i64, text: &str, color: [u8; 3], scale: i64) {
        glyph_dots(text, scale, |col, row, (ox, oy)| {
            self.set(x + col + ox, y + row + oy, color);
        });
    }

    /// Text turned a quarter left (read bottom to top), starting at `(x, y)`: the
    /// bottom-left corner of its box.
    pub fn text_up(&mut self, x: i64, y: i64, text: &str, color: [u8; 3], scale: i64) {
        glyph_dots(text, scale, |col, row, (ox, oy)| {
            self.set(x + row + oy, y - col - ox, color);
        });
    }

    /// Pixels of `r` that are neither background nor grid: what a legend there would hide.
    #[cfg(test)]
    fn ink_in(&self, r: Rect) -> usize {
        (r.y0..=r.y1)
            .flat_map(|y| (r.x0..=r.x1).map(move |x| (x, y)))
            .filter(|&(x, y)| self.get(x, y).is_some_and(|p| p != WHITE && p != GRID))
            .count()
    }

    /// Summed ink (see `ink_in`): entry `(y + 1) * (width + 1) + x + 1` counts the ink
    /// pixels above and left of `(x, y)`, inclusive.
    fn ink_sums(&self) -> InkSums {
        let w = self.width + 1;
        let mut sums = vec![0u32; w * (self.height + 1)];
        for y in 0..self.height {
            let mut row = 0u32;
            for x in 0..self.width {
                let p = self.pixels[y * self.width + x];
                row += u32::from(p != WHITE && p != GRID);
                sums[(y + 1) * w + x + 1] = sums[y * w + x + 1] + row;
            }
        }
        InkSums { width: w, sums }
    }

    /// The PNG encoding.
    pub fn to_png(&self) -> Vec<u8> {
        let row_bytes = 3 * self.width;
        let mut raw = Vec::with_capacity(self.height * (1 + row_bytes));
        let mut above = vec![0u8; row_bytes];
        for row in self.pixels.chunks(self.width) {
            let current: Vec<u8> = row.iter().flatten().copied().collect();
            raw.push(2); // filter "Up": each byte minus the byte above
            raw.extend(current.iter().zip(&above).map(|(c, a)| c.wrapping_sub(*a)));
            above = current;
        }
        let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
        let mut ihdr = Vec::new();
        ihdr.extend_from_slice(&(self.width as u32).to_be_bytes());
        ihdr.extend_from_slice(&(self.height as u32).to_be_bytes());
        ihdr.extend_from_slice(&[8, 2, 0, 0, 0]); // 8-bit RGB
        chunk(&mut png, b"IHDR", &ihdr);
        chunk(&mut png, b"IDAT", &zlib_runs(&raw));
        chunk(&mut png, b"IEND", &[]);
        png
    }
}

/// CRC-32 (ISO-HDLC, as PNG uses).
pub fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

/// Adler-32 (as zlib uses).
pub fn adler32(bytes: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for &byte in bytes {
        a = (a + u32::from(byte)) % 65_521;
        b = (b + a) % 65_521;
    }
    (b << 16) | a
}

fn chunk(png: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    png.extend_from_slice(&(data.len() as u32).to_be_bytes());
    let start = png.len();
    png.extend_from_slice(kind);
    png.extend_from_slice(data);
    let crc = crc32(&png[start..]);
    png.extend_from_slice(&crc.to_be_bytes());
}

/// Lengths' base values and extra bits for length codes 257..=285 (RFC 1951, 3.2.5).
const LENGTH_BASE: [(u16, u8); 29] = [
    (3, 0),
    (4, 0),
    (5, 0),
    (6, 0),
    (7, 0),
    (8, 0),
    (9, 0),
    (10, 0),
    (11, 1),
    (13, 1),
    (15, 1),
    (17, 1),
    (19, 2),
    (23, 2),
    (27, 2),
    (31, 2),
    (35, 3),
    (43, 3),
    (51, 3),
    (59, 3),
    (67, 4),
    (83, 4),
    (99, 4),
    (115, 4),
    (131, 5),
    (163, 5),
    (195, 5),
    (227, 5),
    (258, 0),
];
/// Longest match deflate allows.
const MATCH_MAX: usize = 258;

/// Deflate's bit order: values least significant bit first, Huffman codes most first.
#[derive(Default)]
struct BitWriter {
    out: Vec<u8>,
    bits: u32,
    count: u32,
}

impl BitWriter {
    fn value(&mut self, value: u32, n: u32) {
        debug_assert!(n <= 16 && value < (1 << n));
        self.bits |= value << self.count;
        self.count += n;
        while self.count >= 8 {
            self.out.push(self.bits as u8);
            self.bits >>= 8;
            self.count -= 8;
        }
    }

    fn code(&mut self, code: u32, n: u32) {
        let reversed = code.reverse_bits() >> (32 - n);
        self.value(reversed, n);
    }

    /// A symbol of the fixed literal/length code.
    fn symbol(&mut self, sym: u32) {
        match sym {
            0..=143 => self.code(0x30 + sym, 8),
            144..=255 => self.code(0x190 + sym - 144, 9),
            256..=279 => self.code(sym - 256, 7),
            _ => self.code(0xC0 + sym - 280, 8),
        }
    }

    /// A match of `len` (3..=258) bytes at distance 1.
    fn repeat(&mut self, len: usize) {
        assert!((3..=MATCH_MAX).contains(&len), "match length {len}");
        let index =
            LENGTH_BASE.iter().rposition(|(base, _)| usize::from(*base) <= len).expect("len >= 3");
        let (base, extra) = LENGTH_BASE[index];
        self.symbol(257 + index as u32);
        self.value((len - usize::from(base)) as u32, u32::from(extra));
        self.code(0, 5); // distance code 0: distance 1
    }

    fn finish(mut self) -> Vec<u8> {
        if self.count > 0 {
            self.out.push(self.bits as u8);
        }
        self.out
    }
}

/// A zlib stream of one fixed-Huffman deflate block that codes runs of a repeated byte
/// as matches at distance 1 (plots are mostly runs of white or zero after filtering).
fn zlib_runs(data: &[u8]) -> Vec<u8> {
    let mut w = BitWriter::default();
    w.value(1, 1); // final block
    w.value(1, 2); // fixed Huffman codes
    let mut i = 0;
    // Bounded: each pass consumes at least one byte.
    while i < data.len() {
        let byte = data[i];
        let run = data[i..].iter().take_while(|b| **b == byte).count();
        w.symbol(u32::from(byte));
        let mut left = run - 1;
        while left >= 3 {
            let len = left.min(MATCH_MAX);
            // Never leave a tail of 1 or 2 that could have joined this match.
            let len = if left - len > 0 && left - len < 3 { len - 3 } else { len };
            w.repeat(len);
            left -= len;
        }
        for _ in 0..left {
            w.symbol(u32::from(byte));
        }
        i += run;
    }
    w.symbol(256);
    let mut out = vec![0x78, 0x01];
    out.extend_from_slice(&w.finish());
    out.extend_from_slice(&adler32(data).to_be_bytes());
    out
}

/// Prefix sums of ink over a canvas: the ink of any rectangle in four lookups.
struct InkSums {
    width: usize,
    sums: Vec<u32>,
}

impl InkSums {
    /// Ink pixels in `r` (which lies inside the canvas).
    fn ink(&self, r: Rect) -> u32 {
        let at = |x: i64, y: i64| self.sums[y as usize * self.width + x as usize];
        at(r.x1 + 1, r.y1 + 1) + at(r.x0, r.y0) - at(r.x0, r.y1 + 1) - at(r.x1 + 1, r.y0)
    }
}

/// Calls `dot(column, row, (dx, dy))` for every inked sub-pixel of `text`.
fn glyph_dots(text: &str, scale: i64, mut dot: impl FnMut(i64, i64, (i64, i64))) {
    assert!((1..=4).contains(&scale), "text scale {scale}");
    for (i, c) in text.chars().enumerate() {
        let g = font::glyph(c).or_else(|| font::glyph('?')).expect("the font has '?'");
        for row in 0..font::HEIGHT {
            for col in 0..font::WIDTH {
                if font::ink(&g, col, row) {
                    let (cx, cy) = ((i * font::ADVANCE + col) as i64, row as i64);
                    for d in 0..scale * scale {
                        dot(cx * scale, cy * scale, (d % scale, d / scale));
                    }
                }
            }
        }
    }
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

/// A line plot; [`Plot::draw`] renders it.
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

/// Text scale of titles and tick labels (10×18 pixels a character).
const TEXT_SCALE: i64 = 2;

fn text_width(text: &str, scale: i64) -> i64 {
    (text.chars().count() * font::ADVANCE) as i64 * scale - scale
}

impl Plot {
    /// The plot as an image.
    pub fn draw(&self) -> Canvas {
        self.render().0
    }

    /// The image and where its legend went (`None`: no named series).
    pub fn render(&self) -> (Canvas, Option<Rect>) {
        assert!(self.series.len() <= SERIES_MAX, "at most {SERIES_MAX} series");
        let (w, h) = PLOT_SIZE;
        let mut canvas = Canvas::new(w, h);
        let s = TEXT_SCALE;
        let line_h = font::HEIGHT as i64 * s;
        let title_w = text_width(&self.title, s);
        canvas.text((w as i64 - title_w) / 2, 8, &self.title, BLACK, s);
        let kept = |y: f64| !self.log_y || y > 0.0;
        let points: Vec<(f64, f64)> =
            self.series.iter().flat_map(|s| &s.points).filter(|p| kept(p.1)).copied().collect();
        let fold = |f: fn(&(f64, f64)) -> f64| {
            points.iter().map(f).fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(v), b.max(v)))
        };
        let ((y0, y1), y_ticks) = match (points.is_empty(), self.log_y) {
            (true, _) => linear_ticks(0.0, 1.0),
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
        let label_w = y_ticks.iter().map(|(_, l)| text_width(l, s)).max().unwrap_or(0);
        let (left, right) = (8 + line_h + 12 + label_w + 10, w as i64 - 30);
        let (top, bottom) = (16 + line_h + 14, h as i64 - (2 * line_h + 30));
        let ty = |y: f64| if self.log_y { y.max(1e-12).log10() } else { y };
        let px = |x: f64| left + ((x - x0) / (x1 - x0) * (right - left) as f64).round() as i64;
        let py = |y: f64| {
            bottom - ((ty(y) - ty(y0)) / (ty(y1) - ty(y0)) * (bottom - top) as f64).round() as i64
        };
        for (v, label) in &y_ticks {
            let y = py(*v);
            canvas.thin_line((left, y), (right, y), GRID);
            canvas.line((left - 6, y), (left, y), BLACK);
            canvas.text(left - 10 - text_width(label, s), y - 7 * s / 2, label, BLACK, s);
        }
        for (v, label) in &x_ticks {
            let x = px(*v);
            canvas.thin_line((x, top), (x, bottom), GRID);
            canvas.line((x, bottom), (x, bottom + 6), BLACK);
            canvas.text(x - text_width(label, s) / 2, bottom + 12, label, BLACK, s);
        }
        canvas.line((left, top), (left, bottom), BLACK);
        canvas.line((left, bottom), (right, bottom), BLACK);
        let x_title_w = text_width(&self.x_title, s);
        canvas.text((left + right - x_title_w) / 2, h as i64 - line_h - 6, &self.x_title, BLACK, s);
        let y_title_w = text_width(&self.y_title, s);
        canvas.text_up(8, (top + bottom + y_title_w) / 2, &self.y_title, BLACK, s);
        for (color, series) in PALETTE.iter().zip(&self.series) {
            let kept: Vec<(i64, i64)> =
                series.points.iter().filter(|p| kept(p.1)).map(|&(x, y)| (px(x), py(y))).collect();
            for pair in kept.windows(2) {
                canvas.line(pair[0], pair[1], *color);
            }
            if kept.len() <= 20 {
                for &(x, y) in &kept {
                    canvas.fill(Rect { x0: x - 3, y0: y - 3, x1: x + 3, y1: y + 3 }, *color);
                }
            }
        }
        let area = Rect { x0: left + 2, y0: top, x1: right, y1: bottom - 2 };
        let legend = self.legend(&mut canvas, area);
        (canvas, legend)
    }

    /// Draws the legend box in the corner of `area` where the lines leave the most room.
    fn legend(&self, canvas: &mut Canvas, area: Rect) -> Option<Rect> {
        let named: Vec<(usize, &str)> = self
            .series
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.name.is_empty())
            .map(|(i, s)| (i, s.name.as_str()))
            .collect();
        if named.is_empty() {
            return None;
        }
        let (swatch, pad) = (28i64, 8i64);
        let size = |s: i64| {
            let text_w = named.iter().map(|(_, n)| text_width(n, s)).max().unwrap_or(0);
            let row_h = font::HEIGHT as i64 * s + 4;
            (pad + swatch + pad + text_w + pad, pad + row_h * named.len() as i64 + pad - 4, row_h)
        };
        // Where the box hides no line: a corner (bottom right first, a CDF's empty one),
        // else any spot on an 8-pixel grid; large text first, then small. With no free
        // spot, the small box where it hides least.
        let sums = canvas.ink_sums();
        let inset = 10;
        let candidates = |scale: i64| {
            let (box_w, box_h, _) = size(scale);
            let (l, r) = (area.x0 + inset, area.x1 - inset - box_w);
            let (t, b) = (area.y0 + inset, area.y1 - inset - box_h);
            let corners = [(r, b), (l, t), (r, t), (l, b)];
            let grid = (0..=((b - t).max(0) / 8))
                .flat_map(move |j| (0..=((r - l).max(0) / 8)).map(move |i| (l + 8 * i, t + 8 * j)));
            corners
                .into_iter()
                .chain(grid)
                .filter(move |&(x, y)| x >= l && y >= t && x <= r.max(l) && y <= b.max(t))
                .map(move |(x, y)| Rect { x0: x, y0: y, x1: x + box_w, y1: y + box_h })
        };
        let fits = |r: &Rect| r.x1 <= area.x1 && r.y1 <= area.y1;
        let free = [2, 1].into_iter().find_map(|scale| {
            candidates(scale).filter(fits).find(|r| sums.ink(*r) == 0).map(|r| (scale, r))
        });
        let (scale, best) = free.unwrap_or_else(|| {
            let least = candidates(1).filter(fits).min_by_key(|r| sums.ink(*r));
            (1, least.unwrap_or_else(|| candidates(1).next().expect("a corner")))
        });
        let (_, _, row_h) = size(scale);
        canvas.fill(best, WHITE);
        let Rect { x0, y0, x1, y1 } = best;
        for (from, to) in [((x0, y0), (x1, y0)), ((x1, y0), (x1, y1)), ((x0, y1), (x1, y1))] {
            canvas.thin_line(from, to, BLACK);
        }
        canvas.thin_line((x0, y0), (x0, y1), BLACK);
        for (row, (i, name)) in named.iter().enumerate() {
            let color = PALETTE[*i];
            let y = y0 + pad + row as i64 * row_h;
            let mid = y + 7 * scale / 2;
            canvas.fill(
                Rect { x0: x0 + pad, y0: mid - 2, x1: x0 + pad + swatch, y1: mid + 2 },
                color,
            );
            canvas.text(x0 + pad + swatch + pad, y, name, color, scale);
        }
        Some(best)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksums_match_reference_values() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(adler32(b"Wikipedia"), 0x11E6_0398);
    }

    #[test]
    fn png_has_signature_header_and_iend() {
        let mut canvas = Canvas::new(4, 3);
        canvas.line((0, 0), (3, 2), [255, 0, 0]);
        let png = canvas.to_png();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(&png[12..16], b"IHDR");
        assert_eq!(&png[16..20], &4u32.to_be_bytes());
        // IEND: empty chunk with its well-known CRC.
        assert_eq!(&png[png.len() - 12..], b"\0\0\0\0IEND\xAE\x42\x60\x82");
    }

    #[test]
    fn run_deflate_matches_a_reference_stream() {
        // Whole plots were checked with zlib's own decompressor; here, the framing and
        // that runs compress.
        let z = zlib_runs(b"aaaaaaaaaab");
        assert_eq!(&z[..2], &[0x78, 0x01]);
        assert_eq!(&z[z.len() - 4..], &adler32(b"aaaaaaaaaab").to_be_bytes());
        let long = zlib_runs(&vec![0u8; 100_000]);
        assert!(long.len() < 1_000, "a run of zeros compresses, got {} bytes", long.len());
    }

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

    #[test]
    fn the_legend_names_each_series_in_its_colour_inside_the_plot() {
        let plot = three_series();
        let (canvas, legend) = plot.render();
        let r = legend.expect("named series get a legend");
        let (w, h) = PLOT_SIZE;
        assert!(r.x0 > 0 && r.y0 > 0 && r.x1 < w as i64 && r.y1 < h as i64);
        for color in &PALETTE[..3] {
            let inside = (r.y0..=r.y1)
                .flat_map(|y| (r.x0..=r.x1).map(move |x| (x, y)))
                .filter(|&(x, y)| canvas.get(x, y) == Some(*color))
                .count();
            // A swatch (29×5 pixels) and a name in the series' colour.
            assert!(inside > 145 + 100, "colour {color:?}: {inside} pixels in the legend");
        }
        // The CDFs rise from bottom left to top right: the legend goes bottom right,
        // and hides none of their lines.
        assert!(r.x1 > w as i64 / 2 && r.y1 > h as i64 / 2, "{r:?}");
        let mut bare = plot.clone();
        bare.series.iter_mut().for_each(|s| s.name.clear());
        let (lines, none) = bare.render();
        assert!(none.is_none());
        assert_eq!(lines.ink_in(r), 0, "the legend covers no line");
    }

    #[test]
    fn plots_draw_titles_lines_and_log_axes() {
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
        let canvas = plot.draw();
        assert!(canvas.pixels.contains(&PALETTE[0]));
        assert!(canvas.pixels.contains(&PALETTE[1]), "a single kept point gets a marker");
        // The title is drawn in black near the top centre.
        let top = Rect { x0: 400, y0: 0, x1: 560, y1: 40 };
        assert!(canvas.ink_in(top) > 20);
        assert_eq!(Plot::default().draw().width, PLOT_SIZE.0, "an empty plot still draws");
    }
}
