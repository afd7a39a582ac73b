//! Minimal PNG plots, written without a plotting library: an RGB canvas with lines, a
//! 3×5 pixel font for axis numbers, and a PNG encoder ("Up" filter, one fixed-Huffman
//! deflate block coding byte runs as distance-1 matches, CRC-32, Adler-32). Two plots: latency percentiles per run, and p99 latency against
//! throughput per configuration (the scale suite's curves).
//!
//! Axes are logarithmic for latency. Series colors follow a fixed palette; the legend is
//! a list of colored swatches in series order, named in the Markdown file beside the PNG.

/// Width and height of every plot, in pixels.
pub const PLOT_SIZE: (usize, usize) = (800, 500);
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

/// An RGB image.
#[derive(Clone, Debug)]
pub struct Canvas {
    width: usize,
    height: usize,
    pixels: Vec<[u8; 3]>,
}

/// 3×5 glyphs, one row per `u8` (bits 2..0 left to right).
fn glyph(c: char) -> Option<[u8; 5]> {
    Some(match c {
        '0' => [7, 5, 5, 5, 7],
        '1' => [2, 6, 2, 2, 7],
        '2' => [7, 1, 7, 4, 7],
        '3' => [7, 1, 7, 1, 7],
        '4' => [5, 5, 7, 1, 1],
        '5' => [7, 4, 7, 1, 7],
        '6' => [7, 4, 7, 5, 7],
        '7' => [7, 1, 1, 1, 1],
        '8' => [7, 5, 7, 5, 7],
        '9' => [7, 5, 7, 1, 7],
        '.' => [0, 0, 0, 0, 2],
        'k' => [4, 5, 6, 5, 5],
        'm' => [0, 0, 7, 7, 5],
        's' => [0, 3, 2, 1, 6],
        'u' => [0, 5, 5, 5, 7],
        '%' => [5, 1, 2, 4, 5],
        _ => return None,
    })
}

impl Canvas {
    /// A white canvas.
    pub fn new(width: usize, height: usize) -> Canvas {
        assert!(width > 0 && height > 0 && width * height <= 1 << 24, "canvas {width}x{height}");
        Canvas { width, height, pixels: vec![[255; 3]; width * height] }
    }

    /// Sets one pixel; outside the canvas: ignored.
    pub fn set(&mut self, x: i64, y: i64, color: [u8; 3]) {
        if x >= 0 && y >= 0 && (x as usize) < self.width && (y as usize) < self.height {
            self.pixels[y as usize * self.width + x as usize] = color;
        }
    }

    /// A line (Bresenham), two pixels thick.
    pub fn line(&mut self, from: (i64, i64), to: (i64, i64), color: [u8; 3]) {
        let (mut x, mut y) = from;
        let (dx, dy) = ((to.0 - x).abs(), -(to.1 - y).abs());
        let (sx, sy) = (if x < to.0 { 1 } else { -1 }, if y < to.1 { 1 } else { -1 });
        let mut err = dx + dy;
        // Bounded: each pass moves one pixel closer; at most dx - dy + 1 passes.
        for _ in 0..=(dx - dy) {
            self.set(x, y, color);
            self.set(x, y + 1, color);
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

    /// Text in the 3×5 font scaled by 2; unknown characters leave a gap.
    pub fn text(&mut self, x: i64, y: i64, text: &str, color: [u8; 3]) {
        for (i, c) in text.chars().enumerate() {
            let Some(rows) = glyph(c) else { continue };
            for (row, bits) in rows.iter().enumerate() {
                for col in 0..3 {
                    if bits & (4 >> col) != 0 {
                        let (px, py) = (x + (i as i64) * 8 + col * 2, y + row as i64 * 2);
                        for (ox, oy) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
                            self.set(px + ox, py + oy, color);
                        }
                    }
                }
            }
        }
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

/// A short label for a number: `950`, `1.2k`, `35k`, `1.5m`.
pub fn short_number(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.1}m", v / 1e6)
    } else if v >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

/// Plots `series` (x, y) as lines; `log_y`: logarithmic y axis. Points with y <= 0 on a
/// log axis are dropped. At most [`SERIES_MAX`] series.
pub fn line_plot(series: &[Vec<(f64, f64)>], log_y: bool, x_labels: Option<&[&str]>) -> Canvas {
    assert!(series.len() <= SERIES_MAX, "at most {SERIES_MAX} series");
    let (w, h) = PLOT_SIZE;
    let mut canvas = Canvas::new(w, h);
    let (left, right, top, bottom) = (80i64, w as i64 - 20, 20i64, h as i64 - 50);
    let ty = |y: f64| if log_y { y.max(1e-9).log10() } else { y };
    let points: Vec<(f64, f64)> =
        series.iter().flatten().filter(|(_, y)| !log_y || *y > 0.0).copied().collect();
    if points.is_empty() {
        return canvas;
    }
    let (mut x0, mut x1) =
        points.iter().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let (mut y0, mut y1) =
        points.iter().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(ty(p.1)), b.max(ty(p.1))));
    if x1 <= x0 {
        (x0, x1) = (x0 - 1.0, x1 + 1.0);
    }
    if y1 <= y0 {
        (y0, y1) = (y0 - 1.0, y1 + 1.0);
    }
    let px = |x: f64| left + ((x - x0) / (x1 - x0) * (right - left) as f64) as i64;
    let py = |y: f64| bottom - ((ty(y) - y0) / (y1 - y0) * (bottom - top) as f64) as i64;
    let axis = [0, 0, 0];
    canvas.line((left, top), (left, bottom), axis);
    canvas.line((left, bottom), (right, bottom), axis);
    for i in 0..=4 {
        let fy = y0 + (y1 - y0) * f64::from(i) / 4.0;
        let value = if log_y { 10f64.powf(fy) } else { fy };
        let y = bottom - ((fy - y0) / (y1 - y0) * (bottom - top) as f64) as i64;
        canvas.line((left - 5, y), (left, y), axis);
        canvas.text(5, y - 5, &short_number(value), axis);
    }
    match x_labels {
        Some(labels) => {
            for (i, label) in labels.iter().enumerate() {
                canvas.text(px(i as f64) - 10, bottom + 12, label, axis);
            }
        }
        None => {
            for i in 0..=4 {
                let x = x0 + (x1 - x0) * f64::from(i) / 4.0;
                canvas.text(px(x) - 10, bottom + 12, &short_number(x), axis);
            }
        }
    }
    for (color, points) in PALETTE.iter().zip(series) {
        let kept: Vec<(i64, i64)> = points
            .iter()
            .filter(|(_, y)| !log_y || *y > 0.0)
            .map(|&(x, y)| (px(x), py(y)))
            .collect();
        for pair in kept.windows(2) {
            canvas.line(pair[0], pair[1], *color);
        }
        for &(x, y) in &kept {
            for d in -2..=2 {
                canvas.set(x + d, y, *color);
                canvas.set(x, y + d, *color);
            }
        }
    }
    canvas
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
    fn plots_draw_something_and_labels_are_short() {
        let canvas = line_plot(&[vec![(1.0, 10.0), (2.0, 100.0)], vec![(1.0, 5.0)]], true, None);
        assert!(canvas.pixels.iter().any(|p| *p == PALETTE[0]));
        assert_eq!(short_number(950.0), "950");
        assert_eq!(short_number(1_234.0), "1.2k");
        assert_eq!(short_number(35_000.0), "35k");
        assert_eq!(short_number(1_500_000.0), "1.5m");
    }
}
