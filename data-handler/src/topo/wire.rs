//! Protobuf wire-level field splicing.
//!
//! prost drops fields it does not know when it decodes. A newer Multigres may add fields to the
//! records the operator updates, and rewriting a record from a decoded prost message would erase
//! them. Updates therefore replace only the operator's fields inside the stored bytes and copy
//! every other field through unchanged.

/// Why stored bytes are not a well-formed protobuf message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("truncated varint at byte {0}")]
    TruncatedVarint(usize),
    #[error("field {number} runs past the end of the message")]
    TruncatedField { number: u64 },
    #[error("unsupported wire type {wire_type} for field {number}")]
    WireType { number: u64, wire_type: u64 },
    #[error("invalid field number 0")]
    FieldZero,
}

/// One encoded field: its number, its complete encoding (key included) and, for
/// length-delimited fields, the payload.
#[derive(Debug, Clone, Copy)]
struct Field<'a> {
    number: u64,
    raw: &'a [u8],
    payload: &'a [u8],
}

fn read_varint(bytes: &[u8], pos: &mut usize) -> Result<u64, WireError> {
    let start = *pos;
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(*pos).ok_or(WireError::TruncatedVarint(start))?;
        *pos += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(WireError::TruncatedVarint(start))
}

fn fields(bytes: &[u8]) -> Result<Vec<Field<'_>>, WireError> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < bytes.len() {
        let start = pos;
        let key = read_varint(bytes, &mut pos)?;
        let number = key >> 3;
        if number == 0 {
            return Err(WireError::FieldZero);
        }
        let truncated = WireError::TruncatedField { number };
        let (payload_start, end) = match key & 7 {
            0 => {
                read_varint(bytes, &mut pos)?;
                (pos, pos)
            }
            1 => (pos, pos.checked_add(8).ok_or(truncated.clone())?),
            2 => {
                let len = usize::try_from(read_varint(bytes, &mut pos)?)
                    .map_err(|_| truncated.clone())?;
                (pos, pos.checked_add(len).ok_or(truncated.clone())?)
            }
            5 => (pos, pos.checked_add(4).ok_or(truncated.clone())?),
            wire_type => return Err(WireError::WireType { number, wire_type }),
        };
        if end > bytes.len() {
            return Err(truncated);
        }
        out.push(Field {
            number,
            raw: &bytes[start..end],
            payload: &bytes[payload_start..end],
        });
        pos = end;
    }
    Ok(out)
}

/// The payload of a length-delimited field, with several occurrences concatenated: protobuf merges
/// repeated occurrences of an embedded message, and concatenating payloads is that merge.
pub fn embedded(bytes: &[u8], number: u64) -> Result<Vec<u8>, WireError> {
    Ok(fields(bytes)?
        .into_iter()
        .filter(|f| f.number == number)
        .flat_map(|f| f.payload.iter().copied())
        .collect())
}

/// Encodes `payload` as length-delimited field `number`.
pub fn encode_embedded(number: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 6);
    write_varint(&mut out, (number << 3) | 2);
    write_varint(&mut out, payload.len() as u64);
    out.extend_from_slice(payload);
    out
}

fn write_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// `existing` with every field numbered in `replaced` taken from `replacement` instead; all other
/// fields of `existing`, known or not, are kept byte for byte. Fields are emitted in field-number
/// order (stable, so repeated values keep their order), as Go's marshaller writes them.
pub fn splice(existing: &[u8], replacement: &[u8], replaced: &[u64]) -> Result<Vec<u8>, WireError> {
    let mut merged: Vec<Field<'_>> = fields(existing)?
        .into_iter()
        .filter(|f| !replaced.contains(&f.number))
        .collect();
    merged.extend(
        fields(replacement)?
            .into_iter()
            .filter(|f| replaced.contains(&f.number)),
    );
    merged.sort_by_key(|f| f.number);
    Ok(merged.iter().flat_map(|f| f.raw.iter().copied()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Field 1 "a", field 2 varint 150, field 9 (unknown to anyone) fixed32, field 3 "x", "y".
    const MESSAGE: &[u8] = &[
        0x0a, 1, b'a', 0x10, 0x96, 0x01, 0x4d, 1, 2, 3, 4, 0x1a, 1, b'x', 0x1a, 1, b'y',
    ];

    #[test]
    fn splice_replaces_listed_fields_and_keeps_the_rest() {
        // Replacement: field 1 "b", field 3 "z", and field 2 which is not listed so is ignored.
        let replacement = [0x0a, 1, b'b', 0x10, 7, 0x1a, 1, b'z'];
        let out = splice(MESSAGE, &replacement, &[1, 3]).unwrap();
        assert_eq!(
            out,
            [
                0x0a, 1, b'b', 0x10, 0x96, 0x01, 0x1a, 1, b'z', 0x4d, 1, 2, 3, 4
            ]
        );
    }

    #[test]
    fn splice_removes_listed_fields_absent_from_the_replacement() {
        let out = splice(MESSAGE, &[], &[3, 9]).unwrap();
        assert_eq!(out, [0x0a, 1, b'a', 0x10, 0x96, 0x01]);
    }

    #[test]
    fn splice_of_nothing_is_the_replacement_in_field_order() {
        let out = splice(&[], &[0x1a, 1, b'z', 0x0a, 1, b'b'], &[1, 3]).unwrap();
        assert_eq!(out, [0x0a, 1, b'b', 0x1a, 1, b'z']);
    }

    #[test]
    fn embedded_concatenates_occurrences() {
        let bytes = [0x12, 2, 0x08, 1, 0x0a, 0, 0x12, 2, 0x10, 5];
        assert_eq!(embedded(&bytes, 2).unwrap(), [0x08, 1, 0x10, 5]);
        assert_eq!(embedded(&bytes, 7).unwrap(), Vec::<u8>::new());
    }

    #[test]
    fn encode_embedded_writes_key_and_length() {
        let payload = vec![0u8; 200];
        let out = encode_embedded(2, &payload);
        assert_eq!(&out[..3], &[0x12, 0xc8, 0x01]);
        assert_eq!(out.len(), 203);
        assert_eq!(embedded(&out, 2).unwrap(), payload);
    }

    #[test]
    fn malformed_input_is_reported() {
        assert_eq!(
            fields(&[0x0a, 5, b'a']).unwrap_err(),
            WireError::TruncatedField { number: 1 }
        );
        assert_eq!(
            fields(&[0x08, 0x80]).unwrap_err(),
            WireError::TruncatedVarint(1)
        );
        assert_eq!(
            fields(&[0x0b]).unwrap_err(),
            WireError::WireType {
                number: 1,
                wire_type: 3
            }
        );
        assert_eq!(fields(&[0x00, 0]).unwrap_err(), WireError::FieldZero);
    }
}
