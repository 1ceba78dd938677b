//! Gzip decoding with every failure translated into a [`Corruption`].
//!
//! Input is an in-memory slice, so any error here is a property of the bytes,
//! never of the disk or network that delivered them.

use crate::error::Corruption;
use flate2::bufread::GzDecoder;
use std::io::{self, Read};

const SIGNATURE: [u8; 2] = [0x1f, 0x8b];

/// Decompresses a complete single-member gzip file.
///
/// Anything after the gzip stream is rejected: the published files are single
/// streams, so extra bytes mean a damaged or concatenated file.
pub(crate) fn decompress(gz: &[u8], capacity_hint: usize) -> Result<Vec<u8>, Corruption> {
    let mut out = Vec::with_capacity(capacity_hint);
    let mut decoder = decoder(gz)?;
    decoder.read_to_end(&mut out).map_err(decode_error)?;
    ensure_consumed(decoder)?;
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
        assert_eq!(decompress(&gzip(&sample()), 0), Ok(sample()));
    }

    #[test]
    fn rejects_empty_input() {
        assert_eq!(decompress(&[], 0), Err(Corruption::Empty));
    }

    #[test]
    fn rejects_non_gzip() {
        assert_eq!(
            decompress(b"PK\x03\x04", 0),
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
                decompress(&gz[..cut], 0),
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
            decompress(&gz, 0),
            Err(Corruption::TrailingGzipData { extra: 4 })
        );
    }

    #[test]
    fn rejects_bad_crc() {
        let mut gz = gzip(&sample());
        let crc_byte = gz.len() - 8;
        gz[crc_byte] ^= 0xff;
        let err = decompress(&gz, 0).unwrap_err();
        assert!(
            matches!(&err, Corruption::InvalidGzip { detail } if detail.contains("checksum")),
            "{err:?}"
        );
    }
}
