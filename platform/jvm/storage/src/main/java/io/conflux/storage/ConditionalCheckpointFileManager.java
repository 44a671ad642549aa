package io.conflux.storage;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.net.URI;
import java.util.Set;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.PathFilter;
import org.apache.hadoop.fs.UnsupportedFileSystemException;
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager;
import org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager;
import org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Spark Structured Streaming checkpoint file manager whose create-if-absent on S3 is ONE
 * conditional PUT, so a zombie driver cannot overwrite the new owner's offset or commit log.
 *
 * <p>Why: a streaming query records each batch by creating {@code offsets/N} before it runs and
 * {@code commits/N} after, through {@code createAtomic(path, overwriteIfPossible = false)}, which
 * must fail with {@link FileAlreadyExistsException} when the file exists (Spark then stops the
 * query with a concurrent-modification error). Spark's default manager writes a temporary file
 * and renames it into place; on S3 a rename is a copy plus a delete, preceded by an existence
 * probe, so two drivers of one checkpoint (a zombie paused past its lease while another took the
 * flow over, then waking) both pass the probe and the later copy replaces the earlier batch's log
 * entry. Here the create is one PUT with {@code If-None-Match: *} (see {@link ConditionalPut}):
 * the store lets exactly one writer create the key, and the contents become visible only then.
 *
 * <ul>
 *   <li>{@code createAtomic(path, false)} on S3: the bytes are buffered (log files are small)
 *       and sent at {@code close()} in one conditional PUT, retried while the store reports a
 *       concurrent conditional write (409); a rival's existing file is a {@link
 *       FileAlreadyExistsException}. {@code cancel()} sends nothing, so it leaves no object.
 *   <li>{@code createAtomic(path, true)} on S3 (state store files, possibly large): S3A's own
 *       stream, uploaded at {@code close()} (a PUT replaces an object whole), aborted by {@code
 *       cancel()}.
 *   <li>Every other operation on S3 is {@link FileSystemBasedCheckpointFileManager}'s (S3A has no
 *       {@code FileContext} binding for {@code s3://}, and the rename helpers are never used).
 * </ul>
 *
 * <p>{@code spark.sql.streaming.checkpointFileManagerClass} is global to a session, so for every
 * other scheme (the local disk, HDFS) this class hands everything to the manager Spark itself
 * would have chosen ({@code CheckpointFileManager.create}: {@link
 * FileContextBasedCheckpointFileManager}, or {@link FileSystemBasedCheckpointFileManager} when
 * the scheme has no {@code FileContext}): local checkpoints behave exactly as without it.
 */
public class ConditionalCheckpointFileManager implements CheckpointFileManager {
  /** The schemes whose objects live on S3 and are reached through S3A. */
  static final Set<String> S3_SCHEMES = Set.of("s3a", "s3");

  private static final Logger LOG = LoggerFactory.getLogger(ConditionalCheckpointFileManager.class);

  private final CheckpointFileManager delegate;
  /** The S3 file system of the checkpoint; null for any other scheme (everything delegated). */
  private final FileSystem s3;

  /** Spark instantiates checkpoint file managers reflectively with this constructor. */
  public ConditionalCheckpointFileManager(Path path, Configuration hadoopConf) {
    if (isS3(path, hadoopConf)) {
      delegate = new FileSystemBasedCheckpointFileManager(path, hadoopConf);
      try {
        s3 = path.getFileSystem(hadoopConf);
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      }
    } else {
      delegate = sparkDefault(path, hadoopConf);
      s3 = null;
    }
  }

  /** Whether {@code path} (or, when it has no scheme, the default file system) is on S3. */
  static boolean isS3(Path path, Configuration hadoopConf) {
    String scheme = path.toUri().getScheme();
    if (scheme == null) {
      URI defaultFs = FileSystem.getDefaultUri(hadoopConf);
      scheme = defaultFs.getScheme();
    }
    return scheme != null && S3_SCHEMES.contains(scheme.toLowerCase(java.util.Locale.ROOT));
  }

  /** The manager {@code CheckpointFileManager.create} picks when no class is configured. */
  static CheckpointFileManager sparkDefault(Path path, Configuration hadoopConf) {
    try {
      return new FileContextBasedCheckpointFileManager(path, hadoopConf);
    } catch (Exception e) { // Scala throws the checked UnsupportedFileSystemException undeclared
      if (!(e instanceof UnsupportedFileSystemException)) {
        throw e;
      }
      LOG.warn(
          "Could not use FileContext API for managing Structured Streaming checkpoint files at {}."
              + " Using FileSystem API instead for managing log files.",
          path);
      return new FileSystemBasedCheckpointFileManager(path, hadoopConf);
    }
  }

  /** Whether this manager writes through S3 conditional PUTs (false: all delegated). */
  public boolean isConditional() {
    return s3 != null;
  }

  @Override
  public CancellableFSDataOutputStream createAtomic(Path path, boolean overwriteIfPossible) {
    if (s3 == null) {
      return delegate.createAtomic(path, overwriteIfPossible);
    }
    if (!overwriteIfPossible) {
      return new ConditionalStream(s3, path, new ByteArrayOutputStream());
    }
    try {
      return new ReplacingStream(ConditionalPut.openReplace(s3, path));
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  @Override
  public FSDataInputStream open(Path path) {
    return delegate.open(path);
  }

  @Override
  public FileStatus[] list(Path path, PathFilter filter) {
    return delegate.list(path, filter);
  }

  @Override
  public FileStatus[] list(Path path) {
    return delegate.list(path);
  }

  @Override
  public void mkdirs(Path path) {
    delegate.mkdirs(path);
  }

  @Override
  public boolean exists(Path path) {
    return delegate.exists(path);
  }

  @Override
  public void delete(Path path) {
    delegate.delete(path);
  }

  @Override
  public boolean isLocal() {
    return delegate.isLocal();
  }

  @Override
  public Path createCheckpointDirectory() {
    return delegate.createCheckpointDirectory();
  }

  @Override
  public void close() {
    delegate.close();
  }

  /**
   * Bytes kept in memory until {@code close()}, which creates the object in one conditional PUT;
   * {@code cancel()} drops them. A file another writer created first is a {@link
   * FileAlreadyExistsException}, which Spark turns into a concurrent-modification error.
   */
  private static final class ConditionalStream extends CancellableFSDataOutputStream {
    private final FileSystem fs;
    private final Path path;
    private final ByteArrayOutputStream buffer;
    private boolean finished;

    ConditionalStream(FileSystem fs, Path path, ByteArrayOutputStream buffer) {
      super(buffer);
      this.fs = fs;
      this.path = path;
      this.buffer = buffer;
    }

    @Override
    public synchronized void close() throws IOException {
      if (finished) {
        return;
      }
      finished = true;
      super.close(); // flushes into the buffer
      if (!ConditionalPut.create(fs, path, buffer.toByteArray())) {
        throw new FileAlreadyExistsException(path + " already exists (created by another writer)");
      }
    }

    @Override
    public synchronized void cancel() {
      finished = true; // nothing was sent: no object
      buffer.reset();
    }
  }

  /** S3A's stream: the object appears whole at {@code close()}; {@code cancel()} aborts it. */
  private static final class ReplacingStream extends CancellableFSDataOutputStream {
    private final FSDataOutputStream out;
    private boolean finished;

    ReplacingStream(FSDataOutputStream out) {
      super(out);
      this.out = out;
    }

    @Override
    public synchronized void close() throws IOException {
      if (finished) {
        return;
      }
      finished = true;
      super.close();
    }

    @Override
    public synchronized void cancel() {
      if (!finished) {
        finished = true;
        ConditionalPut.abortQuietly(out);
      }
    }
  }
}
