package ec2

import (
	"cmp"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
)

// fakeImages answers CreateImage with ami-0feed and DescribeImages with
// the given states in turn (the last one repeats).
type fakeImages struct {
	states   []types.ImageState
	reason   string
	creates  []*ec2.CreateImageInput
	describe int
}

func (f *fakeImages) CreateImage(_ context.Context, in *ec2.CreateImageInput, _ ...func(*ec2.Options)) (*ec2.CreateImageOutput, error) {
	f.creates = append(f.creates, in)
	return &ec2.CreateImageOutput{ImageId: aws.String("ami-0feed")}, nil
}

func (f *fakeImages) DescribeImages(_ context.Context, in *ec2.DescribeImagesInput, _ ...func(*ec2.Options)) (*ec2.DescribeImagesOutput, error) {
	st := f.states[min(f.describe, len(f.states)-1)]
	f.describe++
	img := types.Image{ImageId: aws.String(in.ImageIds[0]), State: st}
	if f.reason != "" {
		img.StateReason = &types.StateReason{Message: aws.String(f.reason)}
	}
	return &ec2.DescribeImagesOutput{Images: []types.Image{img}}, nil
}

func TestCreateImage(t *testing.T) {
	good := ImageSpec{InstanceID: "i-0123456789abcdef0", Name: "pve-node 2026-12-01", Tags: map[string]string{"b": "2", "a": "1"}}
	for _, tc := range []struct {
		name    string
		spec    ImageSpec
		states  []types.ImageState
		reason  string
		wantErr string
		creates int
		within  time.Duration // CreateImage's timeout: a minute unless the case wants it to pass
	}{
		{name: "available after pending", spec: good, states: []types.ImageState{types.ImageStatePending, types.ImageStatePending, types.ImageStateAvailable}, creates: 1},
		{name: "failed with the reason", spec: good, states: []types.ImageState{types.ImageStateFailed}, reason: "snapshot failed", wantErr: "snapshot failed", creates: 1},
		{name: "never available", spec: good, states: []types.ImageState{types.ImageStatePending}, wantErr: "not available", creates: 1, within: 200 * time.Millisecond},
		{name: "bad instance id asks nothing", spec: ImageSpec{InstanceID: "pve1", Name: "x-node"}, wantErr: "want an i- id"},
		{name: "bad name asks nothing", spec: ImageSpec{InstanceID: good.InstanceID, Name: "a$b"}, wantErr: "image name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeImages{states: tc.states, reason: tc.reason}
			within := cmp.Or(tc.within, time.Minute)
			id, err := CreateImage(context.Background(), f, tc.spec, time.Millisecond, within)
			if len(f.creates) != tc.creates {
				t.Fatalf("%d CreateImage calls, want %d", len(f.creates), tc.creates)
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				var fe *ImageFailedError
				if tc.reason != "" && !errors.As(err, &fe) {
					t.Errorf("a failed image is not an *ImageFailedError: %v", err)
				}
				return
			}
			if err != nil || id != "ami-0feed" {
				t.Fatalf("id %q err %v", id, err)
			}
			in := f.creates[0]
			if aws.ToString(in.InstanceId) != good.InstanceID || aws.ToString(in.Name) != good.Name || aws.ToBool(in.NoReboot) ||
				len(in.TagSpecifications) != 1 || aws.ToString(in.TagSpecifications[0].Tags[0].Key) != "a" {
				t.Errorf("request %+v", in)
			}
		})
	}
}
