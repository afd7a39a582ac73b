//! The test-only fault injections of `FileDisk` (`[testing] power_loss_on_kill` and
//! `eio_on_sigusr1` in a server). They switch process-wide state, so they live in a test
//! binary of their own, apart from every other storage test.

use keel_storage::disk::{fail_next_sync, hold_unsynced_appends, WRITER_BUFFER_BYTES};
use keel_storage::{Disk, FileDisk};

#[test]
fn held_appends_reach_the_file_only_when_synced_and_an_injected_eio_fails_one_sync() {
    let dir = std::env::temp_dir().join(format!("keel-fault-injection-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let on_disk = |name: &str| std::fs::metadata(dir.join(name)).map(|m| m.len()).unwrap();

    // Without holding, a writer's buffer reaches the kernel once it fills.
    let mut disk = FileDisk::open(&dir).unwrap();
    disk.create("plain").unwrap();
    let chunk = vec![7u8; WRITER_BUFFER_BYTES];
    disk.append("plain", &chunk).unwrap();
    disk.append("plain", b"x").unwrap();
    assert!(on_disk("plain") >= WRITER_BUFFER_BYTES as u64, "a full buffer is written");

    // Held: several buffers' worth stays in the process (a kill would lose it) until the
    // file is synced.
    hold_unsynced_appends();
    let mut disk = FileDisk::open(&dir).unwrap();
    disk.create("held").unwrap();
    for _ in 0..4 {
        disk.append("held", &chunk).unwrap();
    }
    assert_eq!(on_disk("held"), 0, "nothing unsynced reaches the file");
    disk.sync("held").unwrap();
    assert_eq!(on_disk("held"), 4 * WRITER_BUFFER_BYTES as u64);

    // One injected EIO fails exactly the next sync, and leaves the appends where they were.
    disk.append("held", b"tail").unwrap();
    fail_next_sync();
    let error = disk.sync("held").unwrap_err();
    assert_eq!(error.raw_os_error(), Some(5), "EIO: {error}");
    disk.sync("held").unwrap();
    assert_eq!(on_disk("held"), 4 * WRITER_BUFFER_BYTES as u64 + 4);
    std::fs::remove_dir_all(&dir).unwrap();
}
