package traces

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"

	"github.com/parquet-go/parquet-go"
)

// ErrTruncated marks a parquet trace that was cut short: its complete row
// groups were read, the rest could not be (TruncatedError says how much).
var ErrTruncated = errors.New("truncated parquet trace")

// TruncatedError reports a parquet trace cut short (a rotated recording
// copied only in part, a disk that filled up): its complete row groups,
// those before its last complete checkpoint, were read; the bytes after it
// (an incomplete row group, or the file's footer) were not.
type TruncatedError struct {
	File string
	// Size is the file's length; Readable the bytes up to the end of its
	// last complete checkpoint.
	Size, Readable int64
	// RowGroups and Rows are what was read.
	RowGroups int
	Rows      int64
}

func (e *TruncatedError) Error() string {
	return fmt.Sprintf("%s: truncated parquet trace: the last %d of its %d bytes (an incomplete row group or the file's footer) are unreadable; its %d complete row groups (%d records) were read",
		e.File, e.Size-e.Readable, e.Size, e.RowGroups, e.Rows)
}

// Unwrap makes errors.Is(err, ErrTruncated) hold.
func (e *TruncatedError) Unwrap() error { return ErrTruncated }

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func crc32c(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// openParts opens a parquet trace whole (one file, nil) or, when it has no
// readable footer at its end but starts as a parquet file does, its parts
// up to the last complete checkpoint (and what was lost).
func openParts(r io.ReaderAt, size int64, path string) ([]*parquet.File, *TruncatedError, error) {
	pf, err := parquet.OpenFile(r, size, parquetFileOptions...)
	if err == nil {
		if _, part := pf.Lookup(parquetPartKey); !part {
			return []*parquet.File{pf}, nil, nil
		}
		// Cut right after a part, before its checkpoint.
		err = errors.New("the file ends with a row group's own footer, not the file's")
	}
	var magic [4]byte
	if n, _ := r.ReadAt(magic[:], 0); n < 4 || string(magic[:]) != "PAR1" {
		if n > 0 && n < 4 && string(magic[:n]) == "PAR1"[:n] {
			// Cut inside the magic: nothing to read.
			return nil, nil, fmt.Errorf("open parquet trace: %w", &TruncatedError{File: path, Size: size})
		}
		return nil, nil, fmt.Errorf("open parquet trace %s: %w", path, err)
	}
	files, end, rerr := recoverParts(r, size)
	if rerr != nil {
		return nil, nil, fmt.Errorf("open parquet trace %s: %w", path, rerr)
	}
	te := &TruncatedError{File: path, Size: size, Readable: end}
	if len(files) == 0 {
		// Nothing to read: no checkpoint survived (or the file was not
		// written by this package, and its footer is broken).
		return nil, nil, fmt.Errorf("open parquet trace: %w", te)
	}
	return files, te, nil
}

// recoverParts finds the last complete checkpoint of a truncated file and
// opens every part before it, in order; end is where that checkpoint ends.
func recoverParts(r io.ReaderAt, size int64) (files []*parquet.File, end int64, err error) {
	for at := size; ; {
		q, ok, err := lastMagic(r, at, checkpointMagic[:])
		if err != nil {
			return nil, 0, err
		}
		if !ok {
			return nil, 4, nil
		}
		if files, ok := partsBefore(r, q, size); ok {
			return files, q + checkpointLen, nil
		}
		at = q // look for an earlier one
	}
}

// checkpoint reads the checkpoint record at q; ok when its CRC holds and it
// fits the file.
func checkpoint(r io.ReaderAt, q, size int64) (part uint32, start, end int64, ok bool) {
	if q < 0 || q+checkpointLen > size {
		return 0, 0, 0, false
	}
	var ck [checkpointLen]byte
	if n, _ := r.ReadAt(ck[:], q); n != checkpointLen {
		return 0, 0, 0, false
	}
	if !bytes.Equal(ck[:4], checkpointMagic[:]) || binary.LittleEndian.Uint32(ck[24:]) != crc32c(ck[:24]) {
		return 0, 0, 0, false
	}
	part = binary.LittleEndian.Uint32(ck[4:])
	start, end = int64(binary.LittleEndian.Uint64(ck[8:])), int64(binary.LittleEndian.Uint64(ck[16:]))
	return part, start, end, end == q && start >= 0 && start < end
}

// partsBefore opens the parts that the checkpoint at q completes: its own
// part and, through the checkpoints each part follows, every one before it
// down to part 0 at offset 0.
func partsBefore(r io.ReaderAt, q, size int64) ([]*parquet.File, bool) {
	var files []*parquet.File
	want := int64(-1)
	for {
		part, start, end, ok := checkpoint(r, q, size)
		if !ok || (want >= 0 && int64(part) != want) {
			return nil, false
		}
		pf, err := parquet.OpenFile(io.NewSectionReader(r, start, end-start), end-start, parquetFileOptions...)
		if err != nil {
			return nil, false
		}
		files = append(files, pf)
		if part == 0 {
			if start != 0 {
				return nil, false
			}
			break
		}
		want = int64(part) - 1
		q = start - checkpointLen
	}
	for i, j := 0, len(files)-1; i < j; i, j = i+1, j-1 {
		files[i], files[j] = files[j], files[i]
	}
	return files, true
}

// lastMagic finds the last occurrence of magic that starts before at
// (reading backwards in chunks); ok false when there is none.
func lastMagic(r io.ReaderAt, at int64, magic []byte) (int64, bool, error) {
	const chunk = 64 << 10
	buf := make([]byte, chunk+len(magic)-1)
	for hi := at; hi > 0; {
		lo := max(0, hi-chunk)
		n := int(min(hi+int64(len(magic))-1, at+int64(len(magic))-1) - lo)
		b := buf[:n]
		m, err := r.ReadAt(b, lo)
		if err != nil && !errors.Is(err, io.EOF) {
			return 0, false, fmt.Errorf("scan for checkpoints: %w", err)
		}
		b = b[:m]
		for end := len(b); end > 0; {
			i := bytes.LastIndex(b[:end], magic)
			if i < 0 {
				break
			}
			if pos := lo + int64(i); pos < at {
				return pos, true, nil
			}
			end = i + len(magic) - 1
		}
		hi = lo
	}
	return 0, false, nil
}
