package sdnzones

import (
	"io/fs"
	"syscall"
)

// inode returns the file's inode number (a rename-over changes it even
// when size and mtime do not).
func inode(fi fs.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}
