//! Kubernetes storage quantities ("10Gi", "500M", "1e9") as byte counts.

/// Bytes of a quantity, or `None` when it is not a valid non-negative quantity.
pub fn quantity_bytes(quantity: &str) -> Option<u128> {
    let quantity = quantity.trim();
    let split = quantity
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(quantity.len());
    let (number, suffix) = quantity.split_at(split);
    let multiplier: f64 = match suffix {
        "" => 1.0,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        exponent if exponent.starts_with(['e', 'E']) => {
            10f64.powi(exponent[1..].parse::<i32>().ok()?)
        }
        _ => return None,
    };
    let value: f64 = number.parse().ok()?;
    Some((value * multiplier).ceil() as u128)
}

#[cfg(test)]
mod tests {
    use super::quantity_bytes;

    #[test]
    fn binary_decimal_and_exponent_forms() {
        assert_eq!(quantity_bytes("10Gi"), Some(10 * 1024 * 1024 * 1024));
        assert_eq!(quantity_bytes("10240Mi"), quantity_bytes("10Gi"));
        assert_eq!(quantity_bytes("1.5Ki"), Some(1536));
        assert_eq!(quantity_bytes("500M"), Some(500_000_000));
        assert_eq!(quantity_bytes("1e9"), Some(1_000_000_000));
        assert_eq!(quantity_bytes("42"), Some(42));
    }

    #[test]
    fn garbage_is_rejected() {
        assert_eq!(quantity_bytes("lots"), None);
        assert_eq!(quantity_bytes("10Xi"), None);
        assert_eq!(quantity_bytes(""), None);
    }
}
