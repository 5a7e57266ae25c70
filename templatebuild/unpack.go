package templatebuild

import (
	"context"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/pve-inspect/pve-inspect/pveapi"
)

// DefaultMaxUnpacked bounds an archive image's disk, and the archive's
// download, by default (Options.MaxUnpacked).
const DefaultMaxUnpacked = 64 << 30

// unpackTarget is what unpacking needs of the builder's client beside
// Proxmox (pveapi.Client): the upload (POST .../storage/{storage}/upload,
// content import) and the removal of an upload that turned out not to be
// the archive's (DELETE .../storage/{storage}/content/{volume}).
type unpackTarget interface {
	Uploader
	FreeVolume(ctx context.Context, volid string) error
}

// boundFlags name the setting of Options.MaxUnpacked.
const boundFlags = "--max-unpacked-gib, [templates] max_unpacked_gib"

// errDownload wraps the failures of an archive's download itself (the
// connection, its bound), as opposed to its content (ErrArchive).
var errDownload = errors.New("download")

// unpacked makes sure the disk of an archive image (Image.Unpack) is on
// storage and returns it. Proxmox's download-url imports no .tar.xz, and
// the daemon runs on the node: the build downloads the archive itself
// (Host.Open: the mirror's or the distribution's URL, each redirect
// checked as the checksum list's fetch is), decompresses it as it arrives
// and uploads its member to Proxmox (content import), which writes it to
// the storage: nothing of it touches the node's disks but through that
// upload, sent only when the image storage has room for it twice
// (roomHolds: Proxmox's spool and its copy; the member's size is the
// archive's header, which a sparse member makes as large as the bound
// whatever the archive's own size). The file is BuildFile's name of the archive's digest, so a file
// another user put on the storage under the image's own name is never
// taken. The archive's digest is known only once it has been read to its
// end, after the upload: a digest that is not the expected one (the list's
// line, or --checksum) frees the uploaded volume and fails the build, as
// does any refusal of the archive's content after the upload (unpackMember).
// A volume of the name already there is reused only when the ledger
// records it unpacked from an archive of the expected digest and it
// hashes, on the node, to the digest recorded; otherwise it is unpacked
// and uploaded again over it. Two builds unpacking the same file at once
// are kept apart by a lock in LockDir (the second is refused).
func (b *Builder) unpacked(ctx context.Context, storage string) (source, error) {
	img := b.o.Recipe.Image
	up, ok := b.px.(unpackTarget)
	if !ok {
		return source{}, errors.New("image: the builder's client cannot upload an unpacked image")
	}
	alg, sum, err := b.checksum(ctx)
	if err != nil {
		return source{}, err
	}
	if sum == "" {
		return source{}, fmt.Errorf("image %s: an archive is unpacked only against its checksum (a checksum list, or --checksum sha256:HEX)", RedactURL(img.URL))
	}
	file := BuildFile(img.URL, img.File, sum)
	volid := storage + ":import/" + file
	unlock, err := b.lockImage(file)
	if err != nil {
		return source{}, err
	}
	defer unlock()
	if src, ok, err := b.reuseUnpacked(ctx, storage, volid, alg+":"+sum); err != nil || ok {
		return src, err
	}
	got, err := b.unpackUpload(ctx, up, storage, file, alg, sum)
	if err != nil {
		return source{}, err
	}
	src, err := b.hashed(ctx, volid, source{importFrom: volid, alg: "sha256"}, got)
	if err == nil {
		err = b.host.RecordImage(ImageRecord{Volume: volid, Archive: alg + ":" + sum, Image: "sha256:" + got})
	}
	if err != nil {
		return source{}, b.freeUpload(up, volid, err)
	}
	return src, nil
}

// reuseUnpacked takes volid when it is on storage, recorded in the ledger
// as unpacked from the archive of digest archive, and hashes on the node
// to the digest recorded; false says to unpack it (again).
func (b *Builder) reuseUnpacked(ctx context.Context, storage, volid, archive string) (source, bool, error) {
	vols, err := b.px.StorageVolumes(ctx, storage, "import")
	if err != nil {
		return source{}, false, err
	}
	if !slices.ContainsFunc(vols, func(v pveapi.StorageVolume) bool { return v.VolID == volid }) {
		return source{}, false, nil
	}
	rec, ok, err := b.host.RecordedImage(volid)
	if err != nil {
		return source{}, false, err
	}
	alg, want, _ := strings.Cut(rec.Image, ":")
	if !ok || rec.Archive != archive || alg != "sha256" {
		b.say("image", "%s is on the node, but no build here recorded unpacking it from this archive: unpacked again", volid)
		return source{}, false, nil
	}
	p, err := b.px.VolumePath(ctx, volid)
	if err != nil {
		return source{}, false, err
	}
	got, err := b.host.Checksum(p, alg)
	if err != nil {
		return source{}, false, fmt.Errorf("checksum of %s: %w", p, err)
	}
	if got != want {
		b.say("image", "%s is on the node with %s %s, not the %s it was unpacked with: unpacked again", volid, alg, got, want)
		return source{}, false, nil
	}
	b.say("image", "%s: %s %s, as unpacked from the archive by an earlier build (checked again after the import)", volid, alg, got)
	return source{importFrom: volid, path: p, alg: alg, sum: got}, true, nil
}

// unpackUpload downloads the archive, uploads its member to file on
// storage and returns the member's sha256; it then reads the archive to
// its end and checks its digest (alg, want). Any failure after the upload
// frees the uploaded volume.
func (b *Builder) unpackUpload(ctx context.Context, up unpackTarget, storage, file, alg, want string) (string, error) {
	img := b.o.Recipe.Image
	volid := storage + ":import/" + file
	limit := b.o.MaxUnpacked
	body, size, err := b.host.Open(ctx, img.URL)
	if err != nil {
		return "", fmt.Errorf("image: download %s: %w", RedactURL(img.URL), err)
	}
	defer func() { _ = body.Close() }()
	if size > limit {
		return "", fmt.Errorf("image: %s is %d bytes, more than the %d an archive may have (%s)", RedactURL(img.URL), size, limit, boundFlags)
	}
	b.say("image", "downloading %s (%s), unpacking %s from it as it arrives and uploading that to %s (the archive's %s checked at its end)",
		RedactURL(img.URL), sizeText(size), img.Unpack, volid, alg)
	archive := newHasher(alg)
	dl := &meteredReader{r: &boundedReader{r: body, left: limit,
		over: fmt.Errorf("%w: the archive is larger than %d bytes (%s)", errDownload, limit, boundFlags)}}
	in := io.TeeReader(dl, archive)
	var member string
	uploaded := false
	err = unpackMember(in, img.Unpack, archiveLimits{Member: limit, Unpacked: limit + 1<<20, Bound: boundFlags}, func(n int64, r io.Reader) error {
		// the member's size is the archive's word (a sparse one's holes
		// cost the archive nothing): the upload is sent only when the
		// image storage has room for it, as an upload over the API is
		release, err := b.o.room.hold(ctx, up, storage, img.Unpack, n)
		if err != nil {
			return err
		}
		defer release()
		b.say("image", "unpacking %s (%d bytes) and uploading it to %s", img.Unpack, n, volid)
		h := sha256.New()
		p := &unpackProgress{b: b, r: io.TeeReader(r, h), name: img.Unpack, size: n, dl: dl}
		if _, err := up.UploadFile(ctx, storage, pveapi.Upload{Content: "import", Filename: file, Size: n}, p); err != nil {
			return fmt.Errorf("image: upload %s: %w", img.Unpack, err)
		}
		uploaded, member = true, hex.EncodeToString(h.Sum(nil))
		b.say("image", "uploaded %s: %d bytes, sha256 %s", img.Unpack, n, member)
		return nil
	})
	if err == nil {
		// the archive's bytes after the xz stream (none in a good one)
		_, err = io.Copy(io.Discard, in)
	}
	if err == nil {
		if got := hex.EncodeToString(archive.Sum(nil)); got != want {
			err = fmt.Errorf("%w: the archive has %s %s, want %s (its checksum): its disk is not kept", ErrArchive, alg, got, want)
		} else {
			b.say("image", "the archive (%d bytes) has %s %s, as its checksum says", dl.n, alg, got)
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", err, context.Cause(ctx))
		}
		if uploaded {
			return "", b.freeUpload(up, volid, fmt.Errorf("image %s: %w", RedactURL(img.URL), err))
		}
		return "", fmt.Errorf("image %s: %w", RedactURL(img.URL), err)
	}
	return member, nil
}

// freeUpload frees volid, uploaded by this build, after cause failed it.
func (b *Builder) freeUpload(up unpackTarget, volid string, cause error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := up.FreeVolume(ctx, volid); err != nil {
		return errors.Join(cause, fmt.Errorf("free the uploaded %s (pvesm free %s): %w", volid, volid, err))
	}
	b.say("image", "%s freed", volid)
	return cause
}

// lockImage takes the node-wide lock of unpacking file (in LockDir; none
// without one): Proxmox's upload writes the file in place, so two at once
// would each hash the other's half.
func (b *Builder) lockImage(file string) (func(), error) {
	if b.o.LockDir == "" {
		return func() {}, nil
	}
	unlock, err := lockFile(b.o.LockDir, "image-"+file+".lock")
	if errors.Is(err, errLocked) {
		return nil, fmt.Errorf("image %s: another build unpacks it now; build again when it is done (%w)", file, err)
	}
	return unlock, err
}

func newHasher(alg string) hash.Hash {
	if alg == "sha512" {
		return sha512.New()
	}
	return sha256.New()
}

// sizeText is a Content-Length for a progress line.
func sizeText(n int64) string {
	if n < 0 {
		return "size not given"
	}
	return fmt.Sprintf("%d bytes", n)
}

// unpackProgress says, at each tenth of the member read, how much of it
// is unpacked and uploaded and how much of the archive downloaded.
type unpackProgress struct {
	b          *Builder
	r          io.Reader
	name       string
	size, done int64
	tenth      int64
	dl         *meteredReader
}

func (p *unpackProgress) Read(q []byte) (int, error) {
	n, err := p.r.Read(q)
	p.done += int64(n)
	if t := p.done * 10 / p.size; t > p.tenth && t < 10 {
		p.tenth = t
		p.b.say("image", "%d%%: %d of %d bytes of %s unpacked and uploaded, %d bytes of the archive downloaded", t*10, p.done, p.size, p.name, p.dl.n)
	}
	return n, err
}
