//! The demo's SVG charts: bars grouped by fault, one series per policy and protection.

use plotters::coord::Shift;
use plotters::prelude::*;

/// One series of bars: a value per category (none: no bar).
pub struct Series {
    /// Legend text.
    pub label: String,
    /// Palette index: a policy's two series share one colour.
    pub colour: usize,
    /// Drawn pale (the unprotected rows), so each policy's protected bar stands out beside it.
    pub pale: bool,
    /// One value per category.
    pub values: Vec<Option<f64>>,
}

/// One series per policy, unprotected (pale) then through once, each valued per category by `value(policy,
/// protected, category)`.
pub fn policy_series<P: Copy>(
    policies: &[P],
    name: fn(P) -> &'static str,
    categories: usize,
    value: impl Fn(P, bool, usize) -> Option<f64>,
) -> Vec<Series> {
    policies
        .iter()
        .enumerate()
        .flat_map(|(i, &p)| [(i, p, false), (i, p, true)])
        .map(|(colour, policy, protected)| Series {
            label: format!(
                "{} {}",
                name(policy),
                if protected { "(once)" } else { "(unprotected)" }
            ),
            colour,
            pale: !protected,
            values: (0..categories).map(|c| value(policy, protected, c)).collect(),
        })
        .collect()
}

/// Draw a grouped bar chart on `area`: `categories` along x, values up to `y_max` (headroom above keeps the
/// legend off the bars).
pub fn grouped_bars(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    caption: &str,
    categories: &[&str],
    series: &[Series],
    y_max: f64,
    y_desc: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let n = categories.len();
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(60)
        .y_label_area_size(50)
        // Categories sit on integers.
        .build_cartesian_2d(-0.5f64..n as f64 - 0.5, 0f64..y_max * 1.35)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| {
            let i = x.round();
            let on_category = (x - i).abs() < 1e-6 && i >= 0.0;
            let category = on_category.then(|| categories.get(i as usize)).flatten();
            category.map(|c| c.to_string()).unwrap_or_default()
        })
        .y_label_formatter(&|y| match *y {
            y if y > y_max => String::new(),
            y if (y - y.round()).abs() < 1e-9 => format!("{y:.0}"),
            y => format!("{y:.1}"),
        })
        .y_desc(y_desc)
        .draw()?;
    let width = 0.8 / series.len().max(1) as f64;
    for (i, s) in series.iter().enumerate() {
        let color = Palette99::pick(s.colour).to_rgba();
        let style = if s.pale {
            color.mix(0.45).filled()
        } else {
            color.filled()
        };
        let bars = s.values.iter().enumerate().filter_map(|(c, value)| {
            let x0 = c as f64 - 0.4 + i as f64 * width;
            value.map(|v| Rectangle::new([(x0, 0.0), (x0 + width * 0.9, v)], style))
        });
        chart
            .draw_series(bars)?
            .label(s.label.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], style));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperMiddle)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}
