//! Gzip decoding with every failure translated into a [`Corruption`].
//!
//! Input is an in-memory slice, so any error here is a property of the bytes,
//! never of the disk or network that delivered them.

use crate::error::Corruption;
use flate2::bufread::GzDecoder;
use std::io::{self, Read};

const SIGNATURE: [u8; 2] = [0x1f, 0x8b];

/// Decompresses a complete single-member gzip file of at most `max_len`
/// decompressed bytes.
///
/// Inflating stops one byte past `max_len`: a file that goes on (a gzip bomb
/// of a few MB inflates to gigabytes) comes back as those `max_len + 1`
/// bytes, unchecked past that point, for the IDX layer to reject as longer
/// than its header announces, so memory stays bounded by the expected size.
/// Anything after a complete gzip stream is rejected: the published files are
/// single streams, so extra bytes mean a damaged or concatenated file.
pub(crate) fn decompress(gz: &[u8], max_len: usize) -> Result<Vec<u8>, Corruption> {
    let limit = max_len.saturating_add(1);
    let mut out = Vec::with_capacity(limit);
    let mut decoder = decoder(gz)?;
    (&mut decoder)
        .take(limit as u64)
        .read_to_end(&mut out)
        .map_err(decode_error)?;
    if out.len() <= max_len {
        ensure_consumed(decoder)?;
    }
    Ok(out)
}

/// Streams the decompressed content of `gz` into `sink` chunk by chunk, so a
/// checksum can be computed without holding the whole content in memory.
pub(crate) fn for_each_chunk(gz: &[u8], mut sink: impl FnMut(&[u8])) -> Result<(), Corruption> {
    let mut decoder = decoder(gz)?;
    let mut chunk = vec![0u8; 1 << 16];
    loop {
        let read = decoder.read(&mut chunk).map_err(decode_error)?;
        if read == 0 {
            break;
        }
        sink(&chunk[..read]);
    }
    ensure_consumed(decoder)
}

fn decoder(gz: &[u8]) -> Result<GzDecoder<&[u8]>, Corruption> {
    if gz.is_empty() {
        return Err(Corruption::Empty);
    }
    if !gz.starts_with(&SIGNATURE) {
        return Err(Corruption::NotGzip {
            found: gz.iter().take(2).copied().collect(),
        });
    }
    Ok(GzDecoder::new(gz))
}

fn ensure_consumed(decoder: GzDecoder<&[u8]>) -> Result<(), Corruption> {
    match decoder.into_inner().len() {
        0 => Ok(()),
        extra => Err(Corruption::TrailingGzipData { extra }),
    }
}

fn decode_error(err: io::Error) -> Corruption {
    if err.kind() == io::ErrorKind::UnexpectedEof {
        Corruption::TruncatedGzip
    } else {
        Corruption::InvalidGzip {
            detail: err.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::decompress;
    use crate::error::Corruption;
    use flate2::Compression;
    use flate2::write::GzEncoder;
    use std::io::Write;

    /// A limit above every sample's length, for the tests that are not about it.
    const ROOMY: usize = 1 << 20;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut encoder = GzEncoder::new(Vec::new(), Compression::fast());
        encoder.write_all(data).expect("write to Vec");
        encoder.finish().expect("finish to Vec")
    }

    fn sample() -> Vec<u8> {
        (0..50_000u32).map(|i| (i * 7 % 251) as u8).collect()
    }

    #[test]
    fn round_trips() {
        assert_eq!(decompress(&gzip(&sample()), ROOMY), Ok(sample()));
    }

    #[test]
    fn stops_one_byte_past_the_limit() {
        let bomb = gzip(&vec![0; 1 << 20]);
        assert_eq!(decompress(&bomb, 1000).map(|out| out.len()), Ok(1001));
        assert_eq!(decompress(&bomb, 1 << 20).map(|out| out.len()), Ok(1 << 20));
    }

    #[test]
    fn rejects_empty_input() {
        assert_eq!(decompress(&[], ROOMY), Err(Corruption::Empty));
    }

    #[test]
    fn rejects_non_gzip() {
        assert_eq!(
            decompress(b"PK\x03\x04", ROOMY),
            Err(Corruption::NotGzip {
                found: vec![b'P', b'K']
            })
        );
    }

    #[test]
    fn rejects_truncation_anywhere() {
        let gz = gzip(&sample());
        for cut in [3, 10, gz.len() / 2, gz.len() - 4, gz.len() - 1] {
            assert_eq!(
                decompress(&gz[..cut], ROOMY),
                Err(Corruption::TruncatedGzip),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn rejects_trailing_data() {
        let mut gz = gzip(&sample());
        gz.extend_from_slice(b"junk");
        assert_eq!(
            decompress(&gz, ROOMY),
            Err(Corruption::TrailingGzipData { extra: 4 })
        );
    }

    #[test]
    fn rejects_bad_crc() {
        let mut gz = gzip(&sample());
        let crc_byte = gz.len() - 8;
        gz[crc_byte] ^= 0xff;
        let err = decompress(&gz, ROOMY).unwrap_err();
        assert!(
            matches!(&err, Corruption::InvalidGzip { detail } if detail.contains("checksum")),
            "{err:?}"
        );
    }
}
