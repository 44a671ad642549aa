package io.conflux.storage;

import io.delta.storage.HadoopFileSystemLogStore;
import java.io.IOException;
import java.util.Iterator;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

/**
 * Delta log store for {@code s3a://} (and {@code s3://}) tables whose commit is ONE conditional
 * PUT: of all writers racing for version {@code N}, on any number of drivers, the store lets
 * exactly one create {@code _delta_log/N.json}; every other gets {@link
 * java.nio.file.FileAlreadyExistsException} and Delta's optimistic concurrency takes over (it
 * re-reads the log and retries at a later version, or fails the conflicting transaction).
 *
 * <p>Why not Delta's own: for {@code s3a} Delta picks {@code S3SingleDriverLogStore}, which checks
 * that {@code N.json} does not exist and then PUTs it, mutually excluded only by a lock inside one
 * JVM. Two drivers writing one table (a zombie driver paused past its lease while another took
 * the flow over, then waking up) both pass the check and the later PUT silently replaces the
 * earlier commit: the table loses a committed transaction. Delta's rename-based stores do not help
 * either: on S3 a rename is a probe and then a copy, which overwrites whatever appeared in
 * between. The conditional PUT ({@code If-None-Match: *}, see {@link ConditionalPut}) is checked
 * by the store itself, so there is nothing between the check and the write.
 *
 * <p>Plugged in with {@code spark.delta.logStore.s3a.impl} / {@code spark.delta.logStore.s3.impl}
 * (pipelines/spark.py); every writer of a table must use it, since one plain PUT can still
 * overwrite. A commit file is written whole in one PUT, so a partial write is never visible and
 * Delta writes its checkpoints in place, without a rename. Reading and listing are Hadoop's
 * ({@link HadoopFileSystemLogStore}): S3 lists are strongly consistent.
 */
public class ConditionalS3ALogStore extends HadoopFileSystemLogStore {

  /** Delta instantiates log stores reflectively with this constructor. */
  public ConditionalS3ALogStore(Configuration initHadoopConf) {
    super(initHadoopConf);
  }

  /**
   * Writes the actions, one line each. With {@code overwrite} false (every commit {@code N.json})
   * the file is created by one conditional PUT, or {@link java.nio.file.FileAlreadyExistsException}
   * says another writer created it first; with {@code overwrite} true ({@code _last_checkpoint})
   * one plain PUT replaces it.
   */
  @Override
  public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration hadoopConf)
      throws IOException {
    FileSystem fs = path.getFileSystem(hadoopConf);
    byte[] data = ConditionalPut.lines(actions); // commits are small: buffered, so a retry resends
    if (overwrite) {
      ConditionalPut.replace(fs, path, data);
    } else if (!ConditionalPut.create(fs, path, data)) {
      throw new java.nio.file.FileAlreadyExistsException(path.toString());
    }
  }

  /** An S3 object appears whole when its PUT completes: never partially visible. */
  @Override
  public Boolean isPartialWriteVisible(Path path, Configuration hadoopConf) {
    return false;
  }
}
