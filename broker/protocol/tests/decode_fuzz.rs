//! Property tests: random and mutated frames never make `frame::decode` panic, and decoding
//! never allocates in proportion to a declared length, only to the bytes actually present.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use quiver_protocol::{frame, ExtFields, RemotingCommand, SerializeType, MAX_FRAME_BYTES};

/// Counts live heap bytes per thread so a test can see the peak during one call.
struct CountingAllocator;

thread_local! {
    static LIVE_BYTES: Cell<usize> = const { Cell::new(0) };
    static PEAK_BYTES: Cell<usize> = const { Cell::new(0) };
}

fn record_alloc(size: usize) {
    let _ = LIVE_BYTES.try_with(|live| {
        let now = live.get() + size;
        live.set(now);
        let _ = PEAK_BYTES.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

fn record_dealloc(size: usize) {
    // Blocks freed on another thread than the one that allocated them just floor at zero.
    let _ = LIVE_BYTES.try_with(|live| live.set(live.get().saturating_sub(size)));
}

// SAFETY: every call is forwarded unchanged to the system allocator; only counters change.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let pointer = unsafe { System.alloc(layout) };
        if !pointer.is_null() {
            record_alloc(layout.size());
        }
        pointer
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(pointer, layout) };
        record_dealloc(layout.size());
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let moved = unsafe { System.realloc(pointer, layout, new_size) };
        if !moved.is_null() {
            record_dealloc(layout.size());
            record_alloc(new_size);
        }
        moved
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Decodes every frame in `input`, returning the peak extra heap bytes held meanwhile.
fn decode_all_measuring(input: &[u8]) -> usize {
    let mut buf = BytesMut::from(input);
    let baseline = LIVE_BYTES.with(Cell::get);
    PEAK_BYTES.with(|peak| peak.set(baseline));
    // Each successful decode consumes at least 8 bytes, so this bounds the loop.
    for _ in 0..=input.len() / 8 {
        match frame::decode(&mut buf) {
            Ok(Some(command)) => drop(command),
            Ok(None) | Err(_) => break,
        }
    }
    drop(buf);
    PEAK_BYTES.with(Cell::get).saturating_sub(baseline)
}

/// What decoding may hold at most: a generous multiple of the input (JSON values cost more
/// than their text), never anything near a declared-but-absent length.
fn allocation_bound(input_len: usize) -> usize {
    64 * input_len + 64 * 1024
}

fn command_strategy() -> impl Strategy<Value = RemotingCommand> {
    (
        any::<i16>(),
        prop::sample::select(vec!["JAVA", "CPP", "RUST", "GO"]),
        any::<i16>(),
        any::<i32>(),
        0..4i32,
        prop::option::of("[a-zA-Z0-9 %@]{1,20}"),
        prop::collection::hash_map("[a-zA-Z]{1,8}", "[ -~]{0,16}", 0..6),
        prop::collection::vec(any::<u8>(), 0..64),
        prop::bool::ANY,
    )
        .prop_map(
            |(code, language, version, opaque, flag, remark, ext, body, binary)| RemotingCommand {
                code: i32::from(code),
                language: language.to_owned(),
                version: i32::from(version),
                opaque,
                flag,
                remark,
                ext_fields: ext.into_iter().collect::<ExtFields>(),
                body: Bytes::from(body),
                body_chain: Vec::new(),
                serialize_type: if binary {
                    SerializeType::RocketMq
                } else {
                    SerializeType::Json
                },
            },
        )
}

/// One way to damage an encoded frame.
#[derive(Debug, Clone)]
enum Mutation {
    FlipByte { at: usize, mask: u8 },
    OverwriteWord { at: usize, value: i32 },
    Truncate { keep: usize },
    AppendGarbage(Vec<u8>),
}

fn mutation_strategy() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 1..=255u8).prop_map(|(at, mask)| Mutation::FlipByte { at, mask }),
        (
            any::<usize>(),
            prop_oneof![
                any::<i32>(),
                Just(i32::MAX),
                Just(-1),
                Just(MAX_FRAME_BYTES as i32),
                Just(MAX_FRAME_BYTES as i32 + 1),
                Just(0x00FF_FFFF),
                Just(0x01FF_FFFF),
            ]
        )
            .prop_map(|(at, value)| Mutation::OverwriteWord { at, value }),
        // The total length, the header word, and the binary header's remark length.
        (prop::sample::select(vec![0usize, 4, 21]), any::<i32>())
            .prop_map(|(at, value)| Mutation::OverwriteWord { at, value }),
        any::<usize>().prop_map(|keep| Mutation::Truncate { keep }),
        prop::collection::vec(any::<u8>(), 1..32).prop_map(Mutation::AppendGarbage),
    ]
}

fn apply(frame: &mut Vec<u8>, mutation: &Mutation) {
    match mutation {
        Mutation::FlipByte { at, mask } => {
            let len = frame.len();
            frame[at % len] ^= mask;
        }
        Mutation::OverwriteWord { at, value } => {
            if frame.len() < 4 {
                frame.extend_from_slice(&value.to_be_bytes());
                return;
            }
            let at = at % (frame.len() - 3);
            frame[at..at + 4].copy_from_slice(&value.to_be_bytes());
        }
        Mutation::Truncate { keep } => frame.truncate(keep % (frame.len() + 1)),
        Mutation::AppendGarbage(garbage) => frame.extend_from_slice(garbage),
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 2000,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_bytes_never_panic_or_over_allocate(input in prop::collection::vec(any::<u8>(), 0..512)) {
        let peak = decode_all_measuring(&input);
        prop_assert!(peak <= allocation_bound(input.len()), "peak {} for {} bytes", peak, input.len());
    }

    #[test]
    fn random_bytes_behind_a_plausible_prefix_never_panic(
        serialize_type in 0..3u8,
        header_len in 0..600u32,
        rest in prop::collection::vec(any::<u8>(), 0..512),
    ) {
        let mut input = Vec::with_capacity(rest.len() + 8);
        input.extend_from_slice(&(4 + rest.len() as u32).to_be_bytes());
        input.extend_from_slice(&(u32::from(serialize_type) << 24 | header_len).to_be_bytes());
        input.extend_from_slice(&rest);
        let peak = decode_all_measuring(&input);
        prop_assert!(peak <= allocation_bound(input.len()), "peak {} for {} bytes", peak, input.len());
    }

    #[test]
    fn mutated_frames_never_panic_or_over_allocate(
        command in command_strategy(),
        mutations in prop::collection::vec(mutation_strategy(), 1..4),
    ) {
        let mut encoded = frame::encode_to_bytes(&command).unwrap().to_vec();
        for mutation in &mutations {
            if encoded.is_empty() {
                break;
            }
            apply(&mut encoded, mutation);
        }
        let peak = decode_all_measuring(&encoded);
        prop_assert!(peak <= allocation_bound(encoded.len()), "peak {} for {} bytes", peak, encoded.len());
    }

    #[test]
    fn valid_frames_round_trip(command in command_strategy()) {
        let mut buf = BytesMut::new();
        frame::encode(&command, &mut buf).unwrap();
        let decoded = frame::decode(&mut buf).unwrap().unwrap();
        prop_assert!(buf.is_empty());
        prop_assert_eq!(decoded, command);
    }
}

#[test]
fn the_allocation_check_catches_a_decoder_that_trusts_lengths() {
    // Guard against a vacuous bound: reserving a declared 16 MiB is visible to the counter.
    let baseline = LIVE_BYTES.with(Cell::get);
    PEAK_BYTES.with(|peak| peak.set(baseline));
    let trusting = Vec::<u8>::with_capacity(MAX_FRAME_BYTES);
    drop(trusting);
    let peak = PEAK_BYTES.with(Cell::get) - baseline;
    assert!(peak >= MAX_FRAME_BYTES);
    assert!(peak > allocation_bound(512));
}
