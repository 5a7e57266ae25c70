package templatebuild

import (
	"context"
	"fmt"
	"slices"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// Template answers GET /v1/templates/builds/{name}: the build of name
// that runs or was remembered (Build), else the template of the name the
// node's builds made (Catalog: done, reused, with the image its build
// ledger records it was built from; false: none). A remembered failed
// build stays the answer, its state and error, whatever exists of the
// name now (the template of a build that failed at its grant, say, which
// the daemon's token may not clone): when the catalog finds the builds'
// template of the name, a last progress line says so (a new request
// answers it). The lookup is the catalog's, so no rate of GETs makes the node
// work more than once per its MaxAge.
func (s *Service) Template(ctx context.Context, name string) (apitype.TemplateBuild, bool, error) {
	last, remembered := s.Build(name)
	if remembered && last.State != apitype.BuildFailed {
		return last, true, nil
	}
	t, found, err := s.o.Catalog.Template(ctx, name)
	if err != nil {
		if remembered {
			// the failed build is the answer when the node cannot be
			// asked (its error says why: often the very reason it failed)
			return last, true, nil
		}
		return apitype.TemplateBuild{}, false, fmt.Errorf("look for template %q: %w", name, err)
	}
	built := found && t.Built
	if remembered {
		if built {
			last.Progress = append(last.Progress, fmt.Sprintf("template %q exists as VM %d, which the node's builds made (its build ledger records it%s); this build of it failed: a new request for the template answers it",
				name, t.VMID, imageSays(t.Image)))
			if over := len(last.Progress) - apitype.MaxBuildProgress; over > 0 {
				last.Progress = slices.Delete(last.Progress, 0, over)
			}
		}
		return last, true, nil
	}
	if !built {
		return apitype.TemplateBuild{}, false, nil
	}
	now := s.o.Now().UTC()
	return apitype.TemplateBuild{Name: name, State: apitype.BuildDone, VMID: t.VMID, Reused: true, Image: t.Image, BuildMode: t.BuildMode,
		Progress: []string{fmt.Sprintf("template %q is VM %d, built earlier, %s", name, t.VMID, Mode(t.BuildMode))}, Started: now, Finished: &now}, true, nil
}

// imageSays is image as a parenthesis's tail: ", built from IMAGE".
func imageSays(image string) string {
	if image == "" {
		return ""
	}
	return ", built from " + image
}
