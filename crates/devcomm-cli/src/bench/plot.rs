//! A dependency-free SVG plot: bandwidth against message size, devcomm and the reference.

use std::fmt::Write as _;
use std::path::Path;

use crate::bench::Record;

/// Writes one line per (series, sms) of devcomm and one per reference, log2 bytes on x, GB/s on y.
/// Records without a devcomm time (a reference that was not available) are left out.
pub(crate) fn write_svg(path: &Path, records: &[Record]) -> std::io::Result<()> {
    let records: Vec<&Record> = records
        .iter()
        .filter(|r| r.devcomm_us.is_finite())
        .collect();
    let (w, h, left, bottom, top, right) = (900.0, 520.0, 70.0, 60.0, 40.0, 260.0);
    let pw = w - left - right;
    let ph = h - top - bottom;
    let xs: Vec<f64> = records
        .iter()
        .map(|r| (r.bytes.max(1) as f64).log2())
        .collect();
    let (xmin, xmax) = xs
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
    let xmax = if xmax > xmin { xmax } else { xmin + 1.0 };
    let ymax = records
        .iter()
        .flat_map(|r| [r.devcomm_gbps, r.nccl_gbps])
        .filter(|v| v.is_finite())
        .fold(1.0f64, f64::max)
        * 1.1;
    let px = |x: f64| left + (x - xmin) / (xmax - xmin) * pw;
    let py = |y: f64| top + ph - y / ymax * ph;

    // Series: devcomm per (op, both, sms), and the reference per (op, both, reference).
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    let mut push = |name: String, x: f64, y: f64| {
        if !y.is_finite() {
            return;
        }
        match series.iter_mut().find(|(n, _)| *n == name) {
            Some((_, pts)) => pts.push((x, y)),
            None => series.push((name, vec![(x, y)])),
        }
    };
    for (r, &x) in records.iter().zip(&xs) {
        let dir = if r.both_directions { " both" } else { "" };
        push(
            format!("devcomm {}{dir} ({} SMs)", r.op, r.sms),
            x,
            r.devcomm_gbps,
        );
        push(format!("{}{dir}", r.reference), x, r.nccl_gbps);
    }
    let colors = [
        "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
        "#7f7f7f", "#bcbd22",
    ];
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/>"#
    );
    let title = records
        .first()
        .map(|r| {
            let dtype = r
                .dtype
                .as_deref()
                .map_or(String::new(), |t| format!(" {t}"));
            let redop = r
                .redop
                .as_deref()
                .map_or(String::new(), |o| format!(" {o}"));
            let meaningless = if r.meaningful {
                ""
            } else {
                " (NOT MEANINGFUL: shared GPU)"
            };
            format!(
                "{}{dtype}{redop} ({} ranks) on {}, {}{meaningless}",
                r.op, r.world_size, r.device, r.date
            )
        })
        .unwrap_or_default();
    let y_label = if records.iter().any(|r| r.devcomm_busbw_gbps.is_some()) {
        "GB/s (algorithm bandwidth, as nccl-tests)"
    } else {
        "GB/s (one direction)"
    };
    let _ = write!(
        s,
        r#"<text x="{left}" y="22" font-size="14">{}</text>"#,
        xml(&title)
    );
    for i in 0..=5 {
        let y = ymax * f64::from(i) / 5.0;
        let _ = write!(
            s,
            r##"<line x1="{left}" x2="{0}" y1="{1}" y2="{1}" stroke="#ddd"/><text x="{2}" y="{3}" text-anchor="end">{y:.0}</text>"##,
            left + pw,
            py(y),
            left - 6.0,
            py(y) + 4.0
        );
    }
    let mut x = xmin.ceil();
    while x <= xmax {
        let label = human_bytes(2f64.powf(x));
        let _ = write!(
            s,
            r##"<line x1="{0}" x2="{0}" y1="{top}" y2="{1}" stroke="#eee"/><text x="{0}" y="{2}" text-anchor="middle">{label}</text>"##,
            px(x),
            top + ph,
            top + ph + 16.0
        );
        x += if xmax - xmin > 12.0 { 2.0 } else { 1.0 };
    }
    let _ = write!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">message size</text><text x="18" y="{}" transform="rotate(-90 18 {})" text-anchor="middle">{y_label}</text>"#,
        left + pw / 2.0,
        h - 12.0,
        top + ph / 2.0,
        top + ph / 2.0
    );
    for (i, (name, pts)) in series.iter().enumerate() {
        let c = colors[i % colors.len()];
        let dash = if name.starts_with("devcomm") {
            ""
        } else {
            r#" stroke-dasharray="6 4""#
        };
        let path: String = pts
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1} ", px(x), py(y)))
            .collect();
        let _ = write!(
            s,
            r#"<polyline fill="none" stroke="{c}" stroke-width="2"{dash} points="{path}"/>"#
        );
        for &(x, y) in pts {
            let _ = write!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{c}"/>"#,
                px(x),
                py(y)
            );
        }
        let ly = top + 10.0 + 18.0 * i as f64;
        let _ = write!(
            s,
            r#"<line x1="{0}" x2="{1}" y1="{ly}" y2="{ly}" stroke="{c}" stroke-width="2"{dash}/><text x="{2}" y="{3}">{4}</text>"#,
            w - right + 10.0,
            w - right + 34.0,
            w - right + 40.0,
            ly + 4.0,
            xml(name)
        );
    }
    s.push_str("</svg>\n");
    std::fs::write(path, s)
}

fn human_bytes(b: f64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = b;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.0}{}", UNITS[u])
}

fn xml(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
