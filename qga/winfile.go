package qga

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"strings"
	"unicode/utf8"
)

// winDevices are the names Windows maps to devices in every directory
// (with any extension): a file call on one would reach the device.
// COM and LPT take the ISO 8859-1 superscript digits as digits (COM¹,
// LPT³), and COM0 and LPT0 are listed as reserved too.
var winDevices = []string{"CON", "PRN", "AUX", "NUL",
	"COM0", "COM1", "COM2", "COM3", "COM4", "COM5", "COM6", "COM7", "COM8", "COM9", "COM¹", "COM²", "COM³",
	"LPT0", "LPT1", "LPT2", "LPT3", "LPT4", "LPT5", "LPT6", "LPT7", "LPT8", "LPT9", "LPT¹", "LPT²", "LPT³",
	"CONIN$", "CONOUT$"}

// IsWinPath reports whether p looks like a Windows drive-absolute path
// ("C:\..." or "C:/..."); CleanWinPath says whether it is a valid one.
func IsWinPath(p string) bool {
	return len(p) >= 3 && isDriveLetter(p[0]) && p[1] == ':' && (p[2] == '\\' || p[2] == '/')
}

func isDriveLetter(c byte) bool { return c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' }

// CleanWinPath returns p as the guest file commands take it: a
// drive-absolute Windows path with backslashes, the drive letter upper
// case, doubled and trailing separators dropped. It refuses (ErrInvalid)
// anything else: a relative or UNC path, "." or ".." elements, the
// characters Windows forbids in names (<>:"|?* and control characters;
// a ':' would name an alternate data stream), names ending in a dot or
// space (Windows strips them, so the file would not be the one asked
// for) and device names (CON, NUL, COM1, ...).
func CleanWinPath(p string) (string, error) { return cleanWinPath(p) }

func cleanWinPath(p string) (string, error) {
	switch {
	case strings.IndexByte(p, 0) >= 0:
		return "", fmt.Errorf("%w: guest path contains NUL", ErrInvalid)
	case !utf8.ValidString(p):
		return "", fmt.Errorf("%w: guest path is not valid UTF-8", ErrInvalid)
	case !IsWinPath(p):
		return "", fmt.Errorf("%w: guest path %q is not a drive-absolute Windows path (C:\\dir\\file)", ErrInvalid, clipString(p, maxDescLen))
	}
	var elems []string
	for _, e := range strings.FieldsFunc(p[3:], func(r rune) bool { return r == '\\' || r == '/' }) {
		if err := checkWinName(e); err != nil {
			return "", err
		}
		elems = append(elems, e)
	}
	return strings.ToUpper(p[:1]) + `:\` + strings.Join(elems, `\`), nil
}

// checkWinName checks one element of a Windows path.
func checkWinName(e string) error {
	bad := func(why string) error {
		return fmt.Errorf("%w: guest path element %q %s", ErrInvalid, clipString(e, maxDescLen), why)
	}
	switch {
	case e == "." || e == "..":
		return bad("is not allowed (give the path without it)")
	case strings.ContainsFunc(e, func(r rune) bool { return r < 0x20 || strings.ContainsRune(`<>:"|?*`, r) }):
		return bad(`holds a character Windows forbids in names (<>:"|?* or a control character)`)
	case strings.HasSuffix(e, ".") || strings.HasSuffix(e, " "):
		return bad("ends in a dot or space, which Windows strips")
	}
	stem, _, _ := strings.Cut(e, ".")
	for _, d := range winDevices {
		if strings.EqualFold(strings.TrimRight(stem, " "), d) {
			return bad("is a device name")
		}
	}
	return nil
}

// winSplit returns the directory and the name of the clean path p (not
// a root).
func winSplit(p string) (dir, name string) {
	i := strings.LastIndexByte(p, '\\')
	dir, name = p[:i], p[i+1:]
	if len(dir) == 2 { // "C:"
		dir += `\`
	}
	return dir, name
}

// winJoin joins a clean directory and a name.
func winJoin(dir, name string) string {
	if strings.HasSuffix(dir, `\`) {
		return dir + name
	}
	return dir + `\` + name
}

// winReadFile reads a Windows guest file like ReadFile (ReadFileSized
// with sizeFn).
func (a *Agent) winReadFile(ctx context.Context, p string, w io.Writer, limit int64, sizeFn func(int64) error) (int64, error) {
	q, err := cleanWinPath(p)
	if err != nil {
		return 0, err
	}
	if len(q) == 3 {
		return 0, &PathError{Op: "read", Path: q, Err: ErrIsDir}
	}
	return a.readChecked(ctx, q, w, limit, sizeFn)
}

// winMkdirScript creates PVE_INSPECT_DIR with its parents (cmd's mkdir
// does with command extensions, the default) and exits 0 when it is a
// directory then.
const winMkdirScript = "@echo off\r\n" +
	"mkdir \"%PVE_INSPECT_DIR%\" >nul 2>nul\r\n" +
	"if exist \"%PVE_INSPECT_DIR%\\*\" exit /b 0\r\n" +
	"echo cannot create the directory 1>&2\r\n" +
	"exit /b 1\r\n"

// winMoveScript renames PVE_INSPECT_SRC over PVE_INSPECT_DST, and exits
// 3 when the target is a directory (move would put the file into it).
const winMoveScript = "@echo off\r\n" +
	"if exist \"%PVE_INSPECT_DST%\\*\" exit /b 3\r\n" +
	"move /y \"%PVE_INSPECT_SRC%\" \"%PVE_INSPECT_DST%\" >nul || exit /b 1\r\n" +
	"exit /b 0\r\n"

// winDelScript deletes PVE_INSPECT_SRC.
const winDelScript = "@echo off\r\n" +
	"del /f /q \"%PVE_INSPECT_SRC%\" >nul 2>nul\r\n" +
	"exit /b 0\r\n"

// winWriteFile writes a Windows guest file like WriteFile: a temporary
// file in the target directory, renamed over the target when complete,
// the parent created when missing. mode is checked but not applied.
func (a *Agent) winWriteFile(ctx context.Context, p string, r io.Reader, mode fs.FileMode) error {
	q, err := cleanWinPath(p)
	if err != nil {
		return err
	}
	if mode&^fs.ModePerm != 0 {
		return fmt.Errorf("%w: mode %v has bits beyond the permissions", ErrInvalid, mode)
	}
	if len(q) == 3 {
		return &PathError{Op: "write", Path: q, Err: ErrIsDir}
	}
	dir, _ := winSplit(q)
	tmp := winJoin(dir, ".pve-inspect-"+randomTag()+".tmp")
	err = a.writeVia(ctx, r, writeSteps{
		open: func(ctx context.Context) (int64, error) { return a.winOpen(ctx, tmp, "w") },
		mkdir: func(ctx context.Context) (*runResult, error) {
			return a.winHelper(ctx, winMkdirScript, map[string]string{"DIR": dir})
		},
		commit: func(ctx context.Context) (*runResult, error) {
			return a.winHelper(ctx, winMoveScript, map[string]string{"SRC": tmp, "DST": q})
		},
		remove: func(ctx context.Context) {
			fresh, cancel := context.WithTimeout(context.WithoutCancel(ctx), handleCloseTimeout)
			defer cancel()
			a.winHelper(fresh, winDelScript, map[string]string{"SRC": tmp})
		},
	})
	if err != nil {
		return &PathError{Op: "write", Path: q, Err: err}
	}
	return nil
}
