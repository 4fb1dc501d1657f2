//! Exact spend amounts: decimal text to integer minor units, never floating point.

use alloc::format;
use alloc::string::String;

/// Parse a non-negative decimal written as JSON number text (`200`, `0.1`,
/// `2.5e1`) into an integer count of minor units with `decimals` places.
///
/// More precision than `decimals` is an error, not a rounding.
pub fn parse_minor_units(text: &str, decimals: u8) -> Result<u128, String> {
    let bad = || format!("{text:?} is not a decimal amount");
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        Some(i) => {
            let exp: i64 = text[i + 1..].parse().map_err(|_| bad())?;
            (&text[..i], exp)
        }
        None => (text, 0),
    };
    if mantissa.starts_with('-') {
        return Err(format!("{text:?} is negative"));
    }
    let (int_part, frac_part) = match mantissa.split_once('.') {
        Some((i, f)) => (i, f),
        None => (mantissa, ""),
    };
    if int_part.is_empty() || !int_part.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    if !frac_part.bytes().all(|b| b.is_ascii_digit()) || mantissa.ends_with('.') {
        return Err(bad());
    }
    // value = digits * 10^shift, in minor units.
    let shift = exponent
        .checked_sub(frac_part.len() as i64)
        .and_then(|s| s.checked_add(i64::from(decimals)))
        .ok_or_else(bad)?;
    let digits = int_part.bytes().chain(frac_part.bytes());
    let mut units: u128 = 0;
    let keep = digits.clone().count() as i64 + shift.min(0);
    for (i, b) in digits.enumerate() {
        let d = u128::from(b - b'0');
        if (i as i64) < keep {
            units = units
                .checked_mul(10)
                .and_then(|u| u.checked_add(d))
                .ok_or_else(|| format!("{text:?} is too large"))?;
        } else if d != 0 {
            return Err(format!("{text:?} has more than {decimals} decimal places"));
        }
    }
    if units == 0 {
        return Ok(0);
    }
    for _ in 0..shift.max(0) {
        units = units.checked_mul(10).ok_or_else(|| format!("{text:?} is too large"))?;
    }
    Ok(units)
}

/// Parse a non-negative decimal (as [`parse_minor_units`]) at 18 decimal
/// places: exact for comparing two amounts whatever their units, such as an
/// amount with an approval threshold.
pub fn parse_decimal(text: &str) -> Result<u128, String> {
    parse_minor_units(text, 18)
}

/// Render minor units back as a decimal with `decimals` places.
pub fn format_minor_units(units: u128, decimals: u8) -> String {
    let s = format!("{units:0>width$}", width = usize::from(decimals) + 1);
    if decimals == 0 {
        return s;
    }
    let (int, frac) = s.split_at(s.len() - usize::from(decimals));
    format!("{int}.{frac}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_decimals() {
        assert_eq!(parse_minor_units("200", 2), Ok(20000));
        assert_eq!(parse_minor_units("0.1", 2), Ok(10));
        assert_eq!(parse_minor_units("0.2", 2), Ok(20));
        assert_eq!(parse_minor_units("2.5e1", 2), Ok(2500));
        assert_eq!(parse_minor_units("1.50", 2), Ok(150));
        assert_eq!(parse_minor_units("1.500", 2), Ok(150));
        assert_eq!(parse_minor_units("150e-2", 2), Ok(150));
        assert_eq!(parse_minor_units("0", 0), Ok(0));
        assert_eq!(parse_minor_units("7", 0), Ok(7));
    }

    #[test]
    fn rejects_what_it_cannot_hold_exactly() {
        assert!(parse_minor_units("0.001", 2).unwrap_err().contains("decimal places"));
        assert!(parse_minor_units("-1", 2).unwrap_err().contains("negative"));
        assert!(parse_minor_units("1e40", 2).unwrap_err().contains("too large"));
        assert!(parse_minor_units("abc", 2).is_err());
        assert!(parse_minor_units("1.", 2).is_err());
        assert!(parse_minor_units(".5", 2).is_err());
        assert!(parse_minor_units("", 2).is_err());
    }

    #[test]
    fn formats_back() {
        assert_eq!(format_minor_units(20000, 2), "200.00");
        assert_eq!(format_minor_units(5, 2), "0.05");
        assert_eq!(format_minor_units(7, 0), "7");
    }
}
