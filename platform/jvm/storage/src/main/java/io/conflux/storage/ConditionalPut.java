package io.conflux.storage;

import java.io.ByteArrayOutputStream;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.InterruptedIOException;
import java.nio.charset.StandardCharsets;
import java.util.Iterator;
import java.util.UUID;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FSDataOutputStreamBuilder;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.s3a.AWSServiceIOException;
import org.apache.hadoop.fs.s3a.RemoteFileChangedException;

/**
 * Writes of one object through Hadoop's S3A connector: a create-if-absent that is ONE conditional
 * PUT ({@code If-None-Match: *}), and a plain replace.
 *
 * <p>Why one PUT: on S3 an object becomes visible whole when its PUT (or multipart completion)
 * succeeds, and the store itself refuses a PUT with {@code If-None-Match: *} (412 Precondition
 * Failed) when the key exists, so of any number of racing writers, on any number of hosts, exactly
 * one creates the key. Every other route is check-then-write: S3A's {@code create(path, false)}
 * probes for the key and then PUTs unconditionally, Delta's {@code S3SingleDriverLogStore} guards
 * that with a lock that lives in one JVM, and Spark's rename-based checkpoint commit is, on S3, an
 * existence probe followed by a copy. A zombie driver (paused past its lease while another driver
 * took the flow over, then waking) passes the check and overwrites the new owner's commit. With
 * the conditional PUT it gets a 412 and learns the file is not its to write.
 *
 * <p>Every write carries a fresh write id (a UUID) as user metadata ({@code x-amz-meta-}{@value
 * #WRITE_ID}, the key {@code pipelines/storage.py} uses for its own conditional creates). S3A
 * retries a PUT whose response was lost; if that PUT had in fact succeeded, the retry meets our
 * own object and gets a 412. The id read back from the object tells our own object from a
 * rival's, so a commit that succeeded is not reported as lost. A store that reports another
 * conditional write to the key still in flight (AWS: 409 ConditionalRequestConflict) is asked
 * again a few times with the same bytes; it then answers 200 or 412.
 *
 * <p>Hadoop 3.4.2 is the first release with S3A conditional create ({@code
 * fs.option.create.conditional.overwrite}, HADOOP-19256); it surfaces the 412 at {@code close()}
 * as {@link RemoteFileChangedException} and the 409 as an {@link AWSServiceIOException}.
 *
 * <p>This is the only class of the package that names S3A classes, so the checkpoint manager
 * loads without them for a local path.
 */
final class ConditionalPut {
  /** User metadata key of the write id (S3A header option, xattr name and HTTP header suffix). */
  static final String WRITE_ID = "conflux-write-id";

  static final String CONDITIONAL_OVERWRITE = "fs.option.create.conditional.overwrite";
  static final String WRITE_ID_HEADER = "fs.s3a.create.header." + WRITE_ID;
  static final String WRITE_ID_XATTR = "header." + WRITE_ID;

  /** How often a create is tried again while the store reports a concurrent one (409). */
  static final int CONFLICT_RETRIES = 5;

  private ConditionalPut() {}

  /**
   * Creates {@code path} with {@code data} unless it exists, in one conditional PUT.
   *
   * @return true if this call created the object (or an earlier attempt of this call did, as its
   *     write id shows); false if the key already held another writer's object
   * @throws IOException the store failed the request (unreachable, refused, still conflicting)
   */
  static boolean create(FileSystem fs, Path path, byte[] data) throws IOException {
    String writeId = newWriteId();
    for (int attempt = 0; ; attempt++) {
      try {
        put(fs, path, data, writeId, true);
        return true;
      } catch (RemoteFileChangedException | FileAlreadyExistsException e) {
        return writtenBy(fs, path, writeId); // 412: the key exists; ours only after a retried PUT
      } catch (AWSServiceIOException e) {
        if (e.statusCode() != 409 || attempt >= CONFLICT_RETRIES) {
          throw e;
        }
        pause(attempt); // 409 ConditionalRequestConflict: a concurrent conditional write in flight
      }
    }
  }

  /** Creates or replaces {@code path} with {@code data}: one unconditional PUT. */
  static void replace(FileSystem fs, Path path, byte[] data) throws IOException {
    put(fs, path, data, newWriteId(), false);
  }

  /**
   * A stream that creates or replaces {@code path} with what is written to it when it is closed
   * (one PUT, or a multipart upload completed at close). Abort it ({@code abort()}) and nothing is
   * written.
   */
  static FSDataOutputStream openReplace(FileSystem fs, Path path) throws IOException {
    return open(fs, path, newWriteId(), false);
  }

  /** Delta's commit file format: each action as UTF-8, each followed by a newline. */
  static byte[] lines(Iterator<String> actions) {
    ByteArrayOutputStream buffer = new ByteArrayOutputStream();
    while (actions.hasNext()) {
      buffer.writeBytes((actions.next() + "\n").getBytes(StandardCharsets.UTF_8));
    }
    return buffer.toByteArray();
  }

  private static void put(FileSystem fs, Path path, byte[] data, String writeId, boolean conditional)
      throws IOException {
    FSDataOutputStream out = open(fs, path, writeId, conditional);
    boolean closed = false;
    try {
      out.write(data);
      out.close(); // the PUT happens here: 200, or 412 for a conditional one
      closed = true;
    } finally {
      if (!closed) {
        abortQuietly(out); // no half-started upload left behind
      }
    }
  }

  private static FSDataOutputStream open(
      FileSystem fs, Path path, String writeId, boolean conditional) throws IOException {
    FSDataOutputStreamBuilder<?, ?> builder = fs.createFile(path);
    builder.overwrite(!conditional).recursive().must(WRITE_ID_HEADER, writeId);
    if (conditional) {
      // If-None-Match: * on the PUT (or the multipart completion); also skips S3A's probes.
      builder.must(CONDITIONAL_OVERWRITE, true);
    }
    return builder.build();
  }

  /**
   * Abandons {@code out}: an S3A stream then uploads nothing, or aborts its multipart upload. After
   * a failed {@code close()} this does nothing; it never hides the failure that led here.
   */
  static void abortQuietly(FSDataOutputStream out) {
    try {
      out.abort();
    } catch (RuntimeException e) {
      // not abortable (not S3A) or already closed: nothing more to release
    }
  }

  /** Whether the object at {@code path} carries {@code writeId}. */
  private static boolean writtenBy(FileSystem fs, Path path, String writeId) throws IOException {
    byte[] found;
    try {
      found = fs.getXAttr(path, WRITE_ID_XATTR);
    } catch (FileNotFoundException e) {
      return false; // deleted since: not ours to claim
    }
    return found != null && writeId.equals(new String(found, StandardCharsets.UTF_8));
  }

  private static String newWriteId() {
    return UUID.randomUUID().toString();
  }

  private static void pause(int attempt) throws InterruptedIOException {
    try {
      Thread.sleep(50L * (attempt + 1));
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new InterruptedIOException("interrupted while retrying a conditional PUT");
    }
  }
}
