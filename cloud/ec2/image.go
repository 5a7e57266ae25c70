package ec2

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
)

// ImageAPI is what making an image of a built node needs from EC2.
type ImageAPI interface {
	CreateImage(ctx context.Context, in *ec2.CreateImageInput, opts ...func(*ec2.Options)) (*ec2.CreateImageOutput, error)
	DescribeImages(ctx context.Context, in *ec2.DescribeImagesInput, opts ...func(*ec2.Options)) (*ec2.DescribeImagesOutput, error)
}

// ImageSpec describes the image to make of a built node.
type ImageSpec struct {
	// InstanceID is the built node (i-...).
	InstanceID string
	// Name is the AMI name: 3-128 of letters, digits and ( ) [ ] . / - ' @ _ and space.
	Name        string
	Description string
	// NoReboot skips the reboot EC2 does for a consistent file system.
	NoReboot bool
	Tags     map[string]string
}

var (
	instanceIDRe = regexp.MustCompile(`^i-[0-9a-f]{8,17}$`)
	imageNameRe  = regexp.MustCompile(`^[A-Za-z0-9()\[\] ./'@_-]{3,128}$`)
)

// CreateImageInput builds the request for s, or says what is wrong.
func CreateImageInput(s ImageSpec) (*ec2.CreateImageInput, error) {
	if !instanceIDRe.MatchString(s.InstanceID) {
		return nil, fmt.Errorf("instance %q: want an i- id", s.InstanceID)
	}
	if !imageNameRe.MatchString(s.Name) {
		return nil, fmt.Errorf("image name %q: want 3-128 of letters, digits, spaces and ( ) [ ] . / - ' @ _", s.Name)
	}
	in := &ec2.CreateImageInput{InstanceId: aws.String(s.InstanceID), Name: aws.String(s.Name), NoReboot: aws.Bool(s.NoReboot)}
	if s.Description != "" {
		in.Description = aws.String(s.Description)
	}
	if len(s.Tags) > 0 {
		keys := make([]string, 0, len(s.Tags))
		for k := range s.Tags {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var tags []types.Tag
		for _, k := range keys {
			tags = append(tags, types.Tag{Key: aws.String(k), Value: aws.String(s.Tags[k])})
		}
		in.TagSpecifications = []types.TagSpecification{{ResourceType: types.ResourceTypeImage, Tags: tags}}
	}
	return in, nil
}

// ImageFailedError is an image EC2 gave up on.
type ImageFailedError struct {
	ID, State, Reason string
}

func (e *ImageFailedError) Error() string {
	return fmt.Sprintf("image %s is %s: %s", e.ID, e.State, e.Reason)
}

// CreateImage asks EC2 for an image of a built node and waits until it is
// available; it returns the image id (also with an error when the wait
// fails, so the caller can name it).
func CreateImage(ctx context.Context, api ImageAPI, s ImageSpec, poll, timeout time.Duration) (string, error) {
	in, err := CreateImageInput(s)
	if err != nil {
		return "", err
	}
	out, err := api.CreateImage(ctx, in)
	if err != nil {
		return "", fmt.Errorf("create image: %w", err)
	}
	id := aws.ToString(out.ImageId)
	if id == "" {
		return "", errors.New("create image: no image id in the answer")
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	last := "pending"
	for {
		d, err := api.DescribeImages(ctx, &ec2.DescribeImagesInput{ImageIds: []string{id}})
		if err == nil && len(d.Images) == 1 {
			img := d.Images[0]
			last = string(img.State)
			switch img.State {
			case types.ImageStateAvailable:
				return id, nil
			case types.ImageStateFailed, types.ImageStateError, types.ImageStateInvalid, types.ImageStateDeregistered:
				reason := ""
				if img.StateReason != nil {
					reason = aws.ToString(img.StateReason.Message)
				}
				return id, &ImageFailedError{ID: id, State: last, Reason: reason}
			}
		}
		t := time.NewTimer(poll)
		select {
		case <-ctx.Done():
			t.Stop()
			return id, fmt.Errorf("image %s: not available after %s (last state: %s)", id, timeout, last)
		case <-t.C:
		}
	}
}
